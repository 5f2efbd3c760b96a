package ledger_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// ledgers opens n ledgers on their own connections to e's server: n
// processes serving one ledger.
func (e *env) ledgers(t *testing.T, n int) []*ledger.Ledger {
	t.Helper()
	out := []*ledger.Ledger{e.l}
	for len(out) < n {
		l, err := ledger.Open(ctxT(t), e.srv.Connect(t), ledger.Config{})
		require.NoError(t, err)
		out = append(out, l)
	}
	return out
}

// race runs op n times at once, spread over ls, and counts the callers
// told they were first; errs are the calls that got no definite answer.
func race(n int, ls []*ledger.Ledger, op func(*ledger.Ledger) (first bool, err error)) (firsts int, errs []error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first, err := op(ls[i%len(ls)])
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case first:
				firsts++
			}
		}()
	}
	wg.Wait()
	return firsts, errs
}

// TestRacingIdenticalDispatchesHaveOneFirst: identical dispatches at once,
// through three ledger processes: every caller gets a definite answer,
// exactly one hears "first", and one card and one command are stored.
func TestRacingIdenticalDispatchesHaveOneFirst(t *testing.T) {
	e := newEnv(t)
	ls := e.ledgers(t, 3)
	for round := range 5 {
		c := newCall("turn-race", "call-"+string(rune('a'+round)), 1)
		firsts, errs := race(60, ls, func(l *ledger.Ledger) (bool, error) {
			res, err := l.Dispatch(ctxT(t), c.dispatchReq())
			return !res.Duplicate, err
		})
		for _, err := range errs {
			t.Fatalf("round %d: a racing dispatch got no definite answer: %v", round, err)
		}
		require.Equal(t, 1, firsts, "round %d: exactly one caller dispatched", round)
		require.Len(t, e.subjectEntries(t, protocol.CardSubject("v1", project, c.card.CardID)), 1)
		cmds := 0
		for _, m := range e.subjectEntries(t, protocol.ToolCommandSubject("v1", project, channel, "echo")) {
			if m.Header.Get(protocol.HeaderToolCallID) == c.id {
				cmds++
			}
		}
		require.Equal(t, 1, cmds, "round %d: one command", round)
	}
}

// TestRacingIdenticalReportsHaveOneFirstAndOneWakeup: identical reports at
// once, through three ledger processes: every caller gets a definite
// answer, exactly one hears "first", and a core NATS subscriber of the
// worker target receives exactly one wakeup.
func TestRacingIdenticalReportsHaveOneFirstAndOneWakeup(t *testing.T) {
	e := newEnv(t)
	ls := e.ledgers(t, 3)
	_, err := e.l.SetRoster(ctxT(t), protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w-race"})
	require.NoError(t, err)
	watcher := e.srv.Connect(t)
	wakeups, err := watcher.SubscribeSync(protocol.WakeupSubject("v1", project, channel, "w-race"))
	require.NoError(t, err)
	require.NoError(t, watcher.Flush())
	for round := range 5 {
		c := newCall("turn-race", "rcall-"+string(rune('a'+round)), 1)
		rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
		firsts, errs := race(100, ls, func(l *ledger.Ledger) (bool, error) {
			out, err := l.Report(ctxT(t), c.reportReq(protocol.StatusSuccess, rc.CardID))
			return !out.Duplicate, err
		})
		for _, err := range errs {
			t.Fatalf("round %d: a racing report got no definite answer: %v", round, err)
		}
		require.Equal(t, 1, firsts, "round %d: exactly one caller's report was accepted", round)
		// Every publish happened before its Report returned; a flush makes
		// the server deliver what it has for the watcher.
		require.NoError(t, watcher.Flush())
		got := 0
		for {
			m, err := wakeups.NextMsg(0)
			if err != nil {
				break
			}
			require.Equal(t, c.id, m.Header.Get(protocol.HeaderToolCallID))
			got++
		}
		require.Equal(t, 1, got, "round %d: one wakeup reached the worker", round)
	}
}
