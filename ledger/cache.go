package ledger

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
)

// cacheSize bounds each of the ledger's read caches. At a few hundred bytes
// an entry this is a few MiB, and it covers every call in flight at the
// rates the hot path reaches (docs/performance.md).
const cacheSize = 16384

// boundedCache is a map with a fixed capacity that forgets its oldest
// insertions first. The ledger's caches only save reads: every value in one
// is either immutable once written (cards, the dispatch half of a call
// record) or checked by a compare-and-set or an expected-last-sequence append
// before anything depends on it, so a stale or missing entry costs a read,
// never a wrong answer.
type boundedCache[V any] struct {
	mu    sync.Mutex
	items map[string]V
	order []string // ring of insertion order
	next  int
	gen   uint64
}

func newBoundedCache[V any](size int) *boundedCache[V] {
	return &boundedCache[V]{items: make(map[string]V, size), order: make([]string, size)}
}

func (c *boundedCache[V]) get(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.items[key]
	return v, ok
}

func (c *boundedCache[V]) put(key string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(key, v)
}

// putUnlessNewer stores v unless the cache holds a value newer than it.
func (c *boundedCache[V]) putUnlessNewer(key string, v V, newer func(cur, v V) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.items[key]; ok && newer(cur, v) {
		return
	}
	c.putLocked(key, v)
}

func (c *boundedCache[V]) putLocked(key string, v V) {
	if _, ok := c.items[key]; ok {
		c.items[key] = v
		return
	}
	if old := c.order[c.next]; old != "" {
		delete(c.items, old)
	}
	c.order[c.next] = key
	c.next = (c.next + 1) % len(c.order)
	c.items[key] = v
}

func (c *boundedCache[V]) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.items, key)
	c.gen++
}

// dropUnless forgets key unless keep holds for the value it has.
func (c *boundedCache[V]) dropUnless(key string, keep func(cur V) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.items[key]; ok && keep(cur) {
		return
	}
	delete(c.items, key)
	c.gen++
}

// clear forgets everything.
func (c *boundedCache[V]) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.items)
	clear(c.order)
	c.next = 0
	c.gen++
}

// generation counts drops. A reader takes it before reading the source and
// stores with putIfUnchanged, so a value read before a concurrent change is
// never cached after that change's drop.
func (c *boundedCache[V]) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

func (c *boundedCache[V]) putIfUnchanged(key string, v V, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == gen {
		c.putLocked(key, v)
	}
}

// cachedRecord is a call record as this process last wrote or read it.
type cachedRecord struct {
	rec *protocol.CallRecord
	rev uint64
}

// caches holds what the hot path would otherwise read back from JetStream
// right after writing it: call records (written by dispatch, read by the
// executor and the report), cards (the executor writes the result card the
// report checks), and the roster entries and tool definitions every call
// reads. Roster and tool entries can be changed by any ledger process, so
// they are dropped when this process sees a write to their subject on core
// NATS (every ledger write is also a core NATS message in the ledger's
// account).
type caches struct {
	records *boundedCache[cachedRecord]
	cards   *boundedCache[*protocol.StoredCard]
	rosters *boundedCache[*protocol.RosterResult] // by subject; nil: the agent has none
	tools   *boundedCache[*protocol.StoredTool]   // by subject; nil: not registered
	// labels learns every tool name registered, from the same watch.
	labels *toollabels.Labels

	mu   sync.Mutex
	nc   *nats.Conn
	subs []*nats.Subscription
	// reconnects is the connection's reconnect count when the roster and
	// tool caches were last known complete: a change made while the
	// connection was down was never seen, so a reconnect empties them.
	reconnects uint64
}

func newCaches() *caches {
	return &caches{
		records: newBoundedCache[cachedRecord](cacheSize),
		cards:   newBoundedCache[*protocol.StoredCard](cacheSize),
		rosters: newBoundedCache[*protocol.RosterResult](cacheSize),
		tools:   newBoundedCache[*protocol.StoredTool](cacheSize),
		labels:  newBuiltinLabels(),
	}
}

// watch subscribes to the subjects whose entries can change under the cache.
// A process that cannot subscribe keeps no roster or tool cache at all.
func (c *caches) watch(nc *nats.Conn, version string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, subj := range []string{
		protocol.RosterSubject(version, "*", "*"),
		protocol.Subject{Kind: protocol.SubjectTool, Version: version, Project: "*", Tool: "*"}.String(),
	} {
		s, err := nc.Subscribe(subj, func(m *nats.Msg) {
			c.changed(m.Subject)
			c.learnVersion(m.Subject, m.Data)
		})
		if err != nil {
			c.unsubscribe()
			return err
		}
		c.subs = append(c.subs, s)
	}
	c.nc, c.reconnects = nc, nc.Stats().Reconnects
	// The subscriptions must be registered with the server before a cached
	// value can be trusted to be dropped on change.
	return nc.Flush()
}

// changed forgets what is cached for a roster or tool subject, and makes a
// tool's name a label of its own.
func (c *caches) changed(subject string) {
	c.rosters.drop(subject)
	c.tools.drop(subject)
	if name := protocol.ToolEntryName(subject); name != "" {
		c.labels.Add(name)
	}
}

// learnVersion makes the version of a tool definition entry a label of its
// own (ToolLabels.VersionLabel).
func (c *caches) learnVersion(subject string, data []byte) {
	name := protocol.ToolEntryName(subject)
	if name == "" {
		return
	}
	var d struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(data, &d) == nil {
		c.labels.AddVersion(name, d.Version)
	}
}

// watching reports whether roster and tool entries may be served from
// memory: the watch is on and has seen every change since they were cached.
// While the connection is down, changes go unseen: nothing is served from
// memory then, and after a reconnect everything cached before is dropped.
func (c *caches) watching() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.subs) == 0 {
		return false
	}
	if !c.nc.IsConnected() {
		return false
	}
	if r := c.nc.Stats().Reconnects; r != c.reconnects {
		c.rosters.clear()
		c.tools.clear()
		c.reconnects = r
	}
	return true
}

func (c *caches) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unsubscribe()
}

func (c *caches) unsubscribe() {
	for _, s := range c.subs {
		_ = s.Unsubscribe()
	}
	c.subs = nil
}

// cardCached returns a card from memory when this process wrote or read it
// before (cards never change), else reads it. A card cached from its own
// write has no Time: only the hot path, which does not look at it, reads
// through here.
func (l *Ledger) cardCached(ctx context.Context, project, cardID string) (*protocol.StoredCard, error) {
	if sc, ok := l.cache.cards.get(protocol.CardSubject(l.version, project, cardID)); ok {
		c := *sc
		return &c, nil
	}
	return l.GetCard(ctx, project, cardID)
}

// rosterCached is GetRoster served from memory while no write to the
// agent's roster subject has been seen since it was read.
func (l *Ledger) rosterCached(ctx context.Context, project, agentID string) (protocol.RosterResult, error) {
	if !l.cache.watching() {
		return l.GetRoster(ctx, project, agentID)
	}
	subj := protocol.RosterSubject(l.version, project, agentID)
	if r, ok := l.cache.rosters.get(subj); ok {
		if r == nil {
			return protocol.RosterResult{}, protocol.NewError(protocol.CodeNotFound, nil, "agent %s has no roster entry in project %s", agentID, project)
		}
		return *r, nil
	}
	gen := l.cache.rosters.generation()
	r, err := l.GetRoster(ctx, project, agentID)
	switch {
	case err == nil:
		l.cache.rosters.putIfUnchanged(subj, &r, gen)
	case isCode(err, protocol.CodeNotFound):
		l.cache.rosters.putIfUnchanged(subj, nil, gen)
	}
	return r, err
}

// toolCached is GetTool served from memory while no write to the tool's
// subject has been seen since it was read.
func (l *Ledger) toolCached(ctx context.Context, project, tool string) (*protocol.StoredTool, error) {
	if !l.cache.watching() {
		return l.GetTool(ctx, project, tool)
	}
	subj := protocol.ToolSubject(l.version, project, tool)
	if st, ok := l.cache.tools.get(subj); ok {
		if st == nil {
			return nil, protocol.NewError(protocol.CodeNotFound, nil, "tool %s is not registered in project %s", tool, project)
		}
		c := *st
		return &c, nil
	}
	gen := l.cache.tools.generation()
	st, err := l.GetTool(ctx, project, tool)
	switch {
	case err == nil:
		c := *st
		l.cache.tools.putIfUnchanged(subj, &c, gen)
	case isCode(err, protocol.CodeNotFound):
		l.cache.tools.putIfUnchanged(subj, nil, gen)
	}
	return st, err
}
