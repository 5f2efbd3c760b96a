package mcpfront

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// Subscribe subscribes fn to a core NATS subject (a plain subscription, no
// queue group, so every other subscriber still gets each message) and
// returns what ends it. fn gets each message's body.
type Subscribe func(subject string, fn func(data []byte)) (unsubscribe func(), err error)

// How a waiting call learns of its report (docs/mcp.md, "Waiting for the
// report").
const (
	// FallbackPollFirst and FallbackPollMax bound the call.get polls of a
	// call whose wakeups the front door hears: only a lost wakeup or a
	// roster that moved elsewhere leaves the answer to them.
	FallbackPollFirst = time.Second
	FallbackPollMax   = 5 * time.Second
	// PollFirst and PollMax bound the polls of a call whose wakeups it
	// cannot hear (no Subscribe, or the roster could not be read or set).
	PollFirst = 20 * time.Millisecond
	PollMax   = 500 * time.Millisecond
	// RosterRecheck is how old a read of the agent's worker target may be
	// when a call starts; an older one is read again.
	RosterRecheck = time.Minute
	// WakeupIdle is how long the wakeup subscription outlives the last
	// waiting call.
	WakeupIdle = time.Minute
)

// waker hears the wakeups of the front door's agent and wakes the calls
// waiting for them.
type waker struct {
	f *Front

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	target  string // worker target subscribed to; "" when none
	unsub   func()
	readAt  time.Time
	stale   bool
	idle    *time.Timer

	// resolveMu serialises reading (and setting) the roster and
	// subscribing, without holding mu, which wakeups take.
	resolveMu sync.Mutex
}

func callKey(turn, call string) string { return turn + "\x00" + call }

// watch registers a call as waiting (before its dispatch, so a wakeup for
// it cannot come before anyone listens) and makes sure the agent's wakeups
// are heard. live says they are: the caller may poll slowly. stop ends the
// wait.
func (w *waker) watch(ctx context.Context, turn, call string) (wake <-chan struct{}, live bool, stop func()) {
	ch := make(chan struct{}, 1)
	key := callKey(turn, call)
	w.mu.Lock()
	if w.waiters == nil {
		w.waiters = map[string]map[chan struct{}]struct{}{}
	}
	if w.waiters[key] == nil {
		w.waiters[key] = map[chan struct{}]struct{}{}
	}
	w.waiters[key][ch] = struct{}{}
	if w.idle != nil {
		w.idle.Stop()
		w.idle = nil
	}
	w.mu.Unlock()
	stop = func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.waiters[key], ch)
		if len(w.waiters[key]) == 0 {
			delete(w.waiters, key)
		}
		if len(w.waiters) == 0 && w.unsub != nil && w.idle == nil {
			w.idle = time.AfterFunc(WakeupIdle, w.idleStop)
		}
	}
	if w.f.cfg.Subscribe == nil {
		return ch, false, stop
	}
	return ch, w.ensure(ctx), stop
}

// idleStop ends the subscription when no call has waited for WakeupIdle:
// an HTTP endpoint dropped from the cache must not keep one forever.
func (w *waker) idleStop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waiters) > 0 || w.unsub == nil {
		return
	}
	w.unsub()
	w.unsub, w.target, w.idle = nil, "", nil
}

// markStale says a poll found a report no wakeup announced: the roster may
// have moved, so the next call reads it again.
func (w *waker) markStale() {
	w.mu.Lock()
	w.stale = true
	w.mu.Unlock()
}

// ensure subscribes to the wakeups of the agent's worker target, reading
// the roster when it was never read, is old, or was found wrong; it sets a
// roster entry (worker_target = the agent) only when the agent has none.
func (w *waker) ensure(ctx context.Context) bool {
	w.resolveMu.Lock()
	defer w.resolveMu.Unlock()
	w.mu.Lock()
	fresh := w.unsub != nil && !w.stale && time.Since(w.readAt) < RosterRecheck
	w.mu.Unlock()
	if fresh {
		return true
	}
	target, err := w.rosterTarget(ctx)
	if err != nil {
		w.f.log.Warn("mcp front door: no wakeups, polling", "project", w.f.cfg.Project, "agent", w.f.cfg.Agent, "err", err)
		w.mu.Lock()
		defer w.mu.Unlock()
		// What was subscribed still stands (it may still be right): the
		// next call tries again.
		return w.unsub != nil
	}
	w.mu.Lock()
	same := w.unsub != nil && w.target == target
	w.mu.Unlock()
	if !same {
		subject := protocol.WakeupSubject(protocol.DefaultVersion, w.f.cfg.Project, "*", target)
		unsub, err := w.f.cfg.Subscribe(subject, w.deliver)
		if err != nil {
			w.f.log.Warn("mcp front door: subscribe to wakeups, polling", "subject", subject, "err", err)
			return false
		}
		w.mu.Lock()
		if w.unsub != nil {
			w.unsub()
		}
		w.unsub, w.target = unsub, target
		w.mu.Unlock()
		w.f.log.Debug("mcp front door: hearing wakeups", "subject", subject)
	}
	w.mu.Lock()
	w.readAt, w.stale = time.Now(), false
	w.mu.Unlock()
	return true
}

// rosterTarget is the agent's worker target; an agent without a roster
// entry gets one naming itself (recorded like any roster.set), so that its
// reports publish wakeups at all.
func (w *waker) rosterTarget(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := w.f.cfg.Ledger.GetRoster(ctx, w.f.cfg.Project, w.f.cfg.Agent)
	if err == nil {
		return r.WorkerTarget, nil
	}
	if !errors.Is(err, protocol.ErrNotFound) {
		return "", err
	}
	set, err := w.f.cfg.Ledger.SetRoster(ctx, protocol.RosterEntry{ProjectID: w.f.cfg.Project, AgentID: w.f.cfg.Agent, WorkerTarget: w.f.cfg.Agent})
	if err != nil {
		return "", err
	}
	w.f.log.Info("mcp front door: the agent had no roster entry; set its worker target to itself", "project", w.f.cfg.Project,
		"agent", w.f.cfg.Agent, "seq", set.Seq)
	return set.WorkerTarget, nil
}

// deliver wakes the calls a wakeup names (any phase: the waiting call reads
// the record and goes on waiting unless its report is there).
func (w *waker) deliver(data []byte) {
	var m struct {
		AgentID     string `json:"agent_id"`
		AgentTurnID string `json:"agent_turn_id"`
		ToolCallID  string `json:"tool_call_id"`
	}
	if json.Unmarshal(data, &m) != nil || m.AgentID != w.f.cfg.Agent {
		// Another agent of the same worker target.
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.waiters[callKey(m.AgentTurnID, m.ToolCallID)] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
