package projector_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// TestRunFollowsTheLedger starts Run on a ledger, keeps appending calls
// while it runs, and checks it follows every entry to the stream's last
// sequence, builds the same views as a catch-up, and returns nil when its
// context ends.
func TestRunFollowsTheLedger(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 4)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	sp := newStopProjector(t, e.JS, s, projector.Config{BatchSize: 16})

	ctx, cancel := context.WithCancel(ledgertest.Ctx(t))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sp.Run(ctx) }()

	waitApplied := func(what string) uint64 {
		t.Helper()
		last := streamLastSeq(t, e)
		require.Eventually(t, func() bool { return sp.Applied() >= last }, time.Minute, 5*time.Millisecond,
			"%s: Run did not reach seq %d", what, last)
		require.Equal(t, last, sp.Applied(), "%s: applied past the stream's end", what)
		return last
	}
	first := waitApplied("the existing ledger")
	require.NotZero(t, first)

	// Entries appended while Run is idle at the tail, a few at a time.
	for i := range 6 {
		c := ledgertest.Call{Project: "proj", Channel: "main", Agent: []string{"alice", "bob"}[i%2],
			Turn: fmt.Sprintf("turn-run-%d", i/2), ID: fmt.Sprintf("run-%d", i), Epoch: 1, Tool: "echo"}
		e.Complete(t, c, protocol.StatusSuccess, `{"n":3}`)
		if i%2 == 1 {
			waitApplied(fmt.Sprintf("after call %d", i))
		}
	}
	last := waitApplied("after the appends")
	require.Greater(t, last, first)
	require.NotZero(t, sp.commits.Load())

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "Run returns nil when its context ends")
	case <-time.After(20 * time.Second):
		require.FailNow(t, "Run did not return after its context was cancelled")
	}
	require.Equal(t, last, sp.Applied())
	requireMetric(t, sp.reg, float64(last), "cgledger_projector_applied_sequence")
	requireMetric(t, sp.reg, float64(last), "cgledger_projector_entries_applied_total")
	requireMetric(t, sp.reg, 0, "cgledger_projector_lag_entries")
	requireMetric(t, sp.reg, 0, "cgledger_projector_stalled")
	requireMetric(t, sp.reg, 0, "cgledger_projector_errors_total", "reason", "nats") // a cancelled Run is not a NATS error

	// What Run built equals a catch-up of the same ledger from scratch.
	other := openStore(t, filepath.Join(t.TempDir(), "other"))
	defer other.Close()
	require.NoError(t, newProjector(t, e, other, 512).CatchUp(ledgertest.Ctx(t)))
	require.Equal(t, digest(t, other), digest(t, s))
	requireSameRows(t, dumpRows(t, other), dumpRows(t, s))
}
