package executor

import (
	"container/list"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// maxCachedSchemas bounds the compiled argument schemas an executor keeps.
const maxCachedSchemas = 4096

// schemaCache keeps the compiled argument schema of the version in force of
// each (project, tool), least recently used first out: a re-registration
// replaces its tool's entry rather than adding one, and many projects do
// not grow it past its bound.
type schemaCache struct {
	mu    sync.Mutex
	max   int
	order *list.List // of *schemaEntry, most recent at the front
	byKey map[string]*list.Element
}

type schemaEntry struct {
	key    string
	seq    uint64
	schema *jsonschema.Schema
}

func newSchemaCache(max int) *schemaCache {
	return &schemaCache{max: max, order: list.New(), byKey: map[string]*list.Element{}}
}

// get returns the schema of key's version seq, if that is the one kept.
func (c *schemaCache) get(key string, seq uint64) (*jsonschema.Schema, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok || el.Value.(*schemaEntry).seq != seq {
		return nil, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*schemaEntry).schema, true
}

// put keeps s as key's schema at version seq.
func (c *schemaCache) put(key string, seq uint64, s *jsonschema.Schema) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		el.Value = &schemaEntry{key: key, seq: seq, schema: s}
		c.order.MoveToFront(el)
		return
	}
	c.byKey[key] = c.order.PushFront(&schemaEntry{key: key, seq: seq, schema: s})
	for c.order.Len() > c.max {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.byKey, old.Value.(*schemaEntry).key)
	}
}

// len is the number of schemas kept.
func (c *schemaCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
