package executor

import (
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/cgledger/cgledger/internal/lru"
)

// maxCachedSchemas bounds the compiled argument schemas an executor keeps.
const maxCachedSchemas = 4096

// schemaCache keeps the compiled argument schema of the version in force of
// each (project, tool), least recently used first out: a re-registration
// replaces its tool's entry rather than adding one, and many projects do
// not grow it past its bound.
type schemaCache struct{ c *lru.Cache[versionedSchema] }

type versionedSchema struct {
	seq    uint64
	schema *jsonschema.Schema
}

func newSchemaCache(size int) *schemaCache {
	return &schemaCache{c: lru.New[versionedSchema](size)}
}

// get returns the schema of key's version seq, if that is the one kept.
func (c *schemaCache) get(key string, seq uint64) (*jsonschema.Schema, bool) {
	v, ok := c.c.Get(key)
	if !ok || v.seq != seq {
		return nil, false
	}
	return v.schema, true
}

// put keeps s as key's schema at version seq.
func (c *schemaCache) put(key string, seq uint64, s *jsonschema.Schema) {
	c.c.Put(key, versionedSchema{seq: seq, schema: s})
}

// len is the number of schemas kept.
func (c *schemaCache) len() int { return c.c.Len() }
