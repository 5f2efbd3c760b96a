// Package schemacache keeps compiled tool schemas by (key, version): the
// executor's argument and result schemas, and the ledger's for a dispatch's
// checks.arguments, so neither compiles a tool's schema per call.
package schemacache

import (
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/cgledger/cgledger/internal/lru"
)

// Cache keeps the compiled schema of the version in force of each key (a
// project and tool), least recently used first out: a re-registration
// replaces its tool's entry rather than adding one, and many projects do
// not grow it past its bound.
type Cache struct{ c *lru.Cache[versioned] }

type versioned struct {
	seq    uint64
	schema *jsonschema.Schema
}

// New returns a cache of at most size schemas.
func New(size int) *Cache {
	return &Cache{c: lru.New[versioned](size)}
}

// Get returns the schema of key's version seq, if that is the one kept.
func (c *Cache) Get(key string, seq uint64) (*jsonschema.Schema, bool) {
	v, ok := c.c.Get(key)
	if !ok || v.seq != seq {
		return nil, false
	}
	return v.schema, true
}

// Put keeps s as key's schema at version seq.
func (c *Cache) Put(key string, seq uint64, s *jsonschema.Schema) {
	c.c.Put(key, versioned{seq: seq, schema: s})
}

// Len is the number of schemas kept.
func (c *Cache) Len() int { return c.c.Len() }
