// Package lru is a bounded map that drops the least recently used entry
// first: the caches that must not grow with history (the executor's
// compiled schemas, the projector's call states) use it.
package lru

import (
	"container/list"
	"sync"
)

// Cache maps string keys to values of type V, holding at most Max entries.
// It is safe for concurrent use.
type Cache[V any] struct {
	mu    sync.Mutex
	max   int
	order *list.List // of *entry[V], most recent at the front
	byKey map[string]*list.Element
}

type entry[V any] struct {
	key string
	v   V
}

// New returns an empty cache of at most size entries (at least 1).
func New[V any](size int) *Cache[V] {
	return &Cache[V]{max: max(size, 1), order: list.New(), byKey: map[string]*list.Element{}}
}

// Get returns k's value and marks it the most recently used.
func (c *Cache[V]) Get(k string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*entry[V]).v, true
}

// Put sets k's value, dropping the least recently used entry when full.
func (c *Cache[V]) Put(k string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(k, v)
}

// PutAll sets every value of m.
func (c *Cache[V]) PutAll(m map[string]V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range m {
		c.putLocked(k, v)
	}
}

func (c *Cache[V]) putLocked(k string, v V) {
	if el, ok := c.byKey[k]; ok {
		el.Value.(*entry[V]).v = v
		c.order.MoveToFront(el)
		return
	}
	c.byKey[k] = c.order.PushFront(&entry[V]{key: k, v: v})
	for c.order.Len() > c.max {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.byKey, old.Value.(*entry[V]).key)
	}
}

// Clear drops every entry.
func (c *Cache[V]) Clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.Init()
	c.byKey = map[string]*list.Element{}
}

// Len is the number of entries held.
func (c *Cache[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
