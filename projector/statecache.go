package projector

import (
	"container/list"
	"sync"
)

// maxCachedStates bounds the call-state cache: the calls a report, wakeup or
// consumption is likely to follow soon are the recent ones.
const maxCachedStates = 32768

// stateCache keeps the newest committed state of recently used calls,
// least recently used first out, so that applying a report or a wakeup
// does not seek the database and memory does not grow with history. A
// cached nil means the call has no state (as of the commits seen).
type stateCache struct {
	mu    sync.Mutex
	max   int
	order *list.List // of *stateEntry, most recent at the front
	byKey map[string]*list.Element
}

type stateEntry struct {
	key string
	st  *CallState
}

func newStateCache(max int) *stateCache {
	return &stateCache{max: max, order: list.New(), byKey: map[string]*list.Element{}}
}

func (c *stateCache) get(k string) (*CallState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*stateEntry).st, true
}

// put keeps st as k's state; the caller holds c.mu.
func (c *stateCache) putLocked(k string, st *CallState) {
	if el, ok := c.byKey[k]; ok {
		el.Value.(*stateEntry).st = st
		c.order.MoveToFront(el)
		return
	}
	c.byKey[k] = c.order.PushFront(&stateEntry{key: k, st: st})
	for c.order.Len() > c.max {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.byKey, old.Value.(*stateEntry).key)
	}
}

func (c *stateCache) put(k string, st *CallState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(k, st)
}

func (c *stateCache) putAll(m map[string]*CallState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, st := range m {
		c.putLocked(k, st)
	}
}

func (c *stateCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.order.Init()
	c.byKey = map[string]*list.Element{}
}

func (c *stateCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
