package ledger_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// clusterLedgers starts a 3-node JetStream cluster and opens one ledger
// (replicas 3) on each node, each on its own connection: three serve
// processes of one R3 ledger.
func clusterLedgers(t *testing.T) []*ledger.Ledger {
	t.Helper()
	c := natstest.StartCluster(t, 3)
	var ls []*ledger.Ledger
	for i := range c.Size() {
		l, err := ledger.Open(ctxT(t), c.Connect(t, i), ledger.Config{Streams: stream.Config{Replicas: 3}})
		require.NoError(t, err)
		t.Cleanup(l.Close)
		ls = append(ls, l)
	}
	return ls
}

// raceOutcomes runs op n times at once, spread over ls, and sorts the
// answers: firsts counts callers told they were first, refusals the
// documented refusals by code, and undefined every error that is not a
// protocol refusal or is "internal".
func raceOutcomes(n int, ls []*ledger.Ledger, op func(*ledger.Ledger) (first bool, err error)) (firsts int, refusals map[protocol.Code]int, undefined []error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	refusals = map[protocol.Code]int{}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first, err := op(ls[i%len(ls)])
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				if first {
					firsts++
				}
				return
			}
			if e, ok := protocol.AsError(err); ok && e.Code != protocol.CodeInternal {
				refusals[e.Code]++
				return
			}
			undefined = append(undefined, err)
		}()
	}
	wg.Wait()
	return firsts, refusals, undefined
}

// TestClusterRacingIdenticalWritesNeverAnswerInternal: on an R3 stream the
// leader answers an "expect this subject empty" append with "wrong last
// sequence" while another append on the subject is proposed and not yet
// applied, so the winner cannot be read yet. Identical dispatches, reports,
// consumes and cancels racing through three ledgers on three nodes must each
// get first, duplicate or a documented refusal, never an internal error.
func TestClusterRacingIdenticalWritesNeverAnswerInternal(t *testing.T) {
	ls := clusterLedgers(t)
	const rounds, callers = 12, 60
	var internal []error
	for round := range rounds {
		c := newCall("turn-cl", fmt.Sprintf("call-%d", round), 1)
		firsts, refusals, undefined := raceOutcomes(callers, ls, func(l *ledger.Ledger) (bool, error) {
			res, err := l.Dispatch(ctxT(t), c.dispatchReq())
			return !res.Duplicate, err
		})
		internal = append(internal, undefined...)
		require.Empty(t, refusals, "round %d: identical dispatches are never refused", round)
		if len(undefined) == 0 {
			require.Equal(t, 1, firsts, "round %d: exactly one caller dispatched", round)
		}

		rc := c.resultCard(protocol.StatusSuccess)
		firsts, refusals, undefined = raceOutcomes(callers, ls, func(l *ledger.Ledger) (bool, error) {
			res, err := l.PutCard(ctxT(t), rc)
			return !res.Duplicate, err
		})
		internal = append(internal, undefined...)
		require.Empty(t, refusals, "round %d: identical cards are never refused", round)
		if len(undefined) == 0 {
			require.Equal(t, 1, firsts, "round %d: exactly one caller stored the result card", round)
		}

		firsts, _, undefined = raceOutcomes(callers, ls, func(l *ledger.Ledger) (bool, error) {
			res, err := l.Report(ctxT(t), c.reportReq(protocol.StatusSuccess, rc.CardID))
			return !res.Duplicate, err
		})
		internal = append(internal, undefined...)
		if len(undefined) == 0 {
			require.Equal(t, 1, firsts, "round %d: exactly one caller's report was accepted", round)
		}

		firsts, refusals, undefined = raceOutcomes(callers, ls, func(l *ledger.Ledger) (bool, error) {
			res, err := l.Consume(ctxT(t), protocol.ConsumeRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id})
			return !res.Duplicate, err
		})
		internal = append(internal, undefined...)
		require.Empty(t, refusals, "round %d: consuming a reported call is never refused", round)
		if len(undefined) == 0 {
			require.Equal(t, 1, firsts, "round %d: exactly one caller consumed", round)
		}

		// Cancels of a dispatched, unreported call: one is stored, the
		// others are duplicates.
		cc := newCall("turn-cl", fmt.Sprintf("cancel-%d", round), 1)
		_, err := ls[0].Dispatch(ctxT(t), cc.dispatchReq())
		require.NoError(t, err)
		firsts, refusals, undefined = raceOutcomes(callers, ls, func(l *ledger.Ledger) (bool, error) {
			res, err := l.Cancel(ctxT(t), protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: cc.turn, ToolCallID: cc.id, Reason: "stop"})
			return !res.Duplicate, err
		})
		internal = append(internal, undefined...)
		require.Empty(t, refusals, "round %d: identical cancels of an unreported call are never refused", round)
		if len(undefined) == 0 {
			require.Equal(t, 1, firsts, "round %d: exactly one caller cancelled", round)
		}
	}
	for i, err := range internal {
		if i < 10 {
			t.Errorf("a racing caller got no definite answer: %v", err)
		}
	}
	require.Empty(t, internal, "%d racing callers got an internal error", len(internal))
}
