package test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// TestExportReplayRoundTrip records a fresh multi-agent ledger (the
// ledgertest scenario, then calls through the executor), exports it, replays
// the export twice in fresh directories, and checks that both replays hold
// the same views row for row, and that they equal the views the projector
// builds from the live ledger stream: the projector keeps no Nats-* header
// and takes times from CG-Time, so where the entries were stored must not
// matter.
func TestExportReplayRoundTrip(t *testing.T) {
	t.Parallel()
	r := newReplayRig(t)
	// The scenario completes its own calls (some on cmd.tool.echo), so it
	// runs before any executor could race it for them; the executor then
	// finds them answered and writes nothing for them.
	r.Scenario(t, 12)
	flaky := executor.ToolFunc(func(_ context.Context, c *executor.Call) executor.Outcome {
		if c.Attempt < 2 {
			return executor.Retryable("R-UPSTREAM-503", "busy", 0)
		}
		return executor.Success(map[string]any{"ok": true})
	})
	r.startExecutor(toolImpl{"flaky", flaky, toolDef("flaky", protocol.DeterminismIdempotent, protocol.RetryPolicy{MaxAttempts: 3, BaseMS: 1, CapMS: 2})})
	r.roster("dave")
	var calls []ledgertest.Call
	for i, agent := range []string{"alice", "bob", "dave", "erin"} { // erin has no roster entry
		turn := fmt.Sprintf("rt-turn-%s", agent)
		echo := scCall(agent, turn, fmt.Sprintf("rt-echo-%d", i), 1, "echo")
		require.Equal(t, protocol.StatusSuccess, r.run(echo, fmt.Sprintf(`{"i":%d}`, i), nil).Status)
		fl := scCall(agent, turn, fmt.Sprintf("rt-flaky-%d", i), 1, "flaky")
		require.Equal(t, protocol.StatusSuccess, r.run(fl, `{}`, nil).Status)
		calls = append(calls, echo, fl)
	}
	slow := scCall("dave", "rt-turn-dave", "rt-slow", 1, "sleep")
	require.Equal(t, protocol.StatusTimeout, r.run(slow, `{"ms":60000}`, func(req *protocol.DispatchRequest) { req.Payload.TimeoutMS = 20 }).Status)
	for i, c := range calls {
		if i%3 == 0 {
			r.consume(c)
		}
	}

	path := filepath.Join(t.TempDir(), "roundtrip.jsonl")
	tr := r.export(path)

	// The projector on the live stream. Every call above has resolved and
	// the executor writes nothing more, so the stream ends at the export.
	store, err := projector.OpenStore(t.TempDir(), projector.StoreOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	p, err := projector.New(store, r.JS, projector.Config{})
	require.NoError(t, err)
	require.NoError(t, p.CatchUp(ledgertest.Ctx(t)))
	live, err := store.DigestNow()
	require.NoError(t, err)
	liveRows, err := dumpRows(store)
	require.NoError(t, err)
	require.Equal(t, tr.LastSeq, live.AppliedSeq, "the live ledger did not grow after the export")

	a := replayFile(t, path, true)
	b := replayFile(t, path, true)
	require.Equal(t, tr.Count, a.res.Entries)
	require.Equal(t, tr.Head, a.res.ChainHead)
	require.Equal(t, a.digestFile(), b.digestFile(), "two replays of one file")
	require.Empty(t, firstRowDiff(a.rows, b.rows), "two replays hold the same view rows")
	require.Equal(t, len(a.rows), len(b.rows))
	require.Equal(t, string(stableJSON(t, a.views)), string(stableJSON(t, b.views)), "two replays answer the same timelines and inboxes")
	require.NotEmpty(t, a.views.Timelines)

	require.Equal(t, live.ChainHead, a.res.ChainHead, "live and replayed chain heads")
	require.Empty(t, firstRowDiff(liveRows, a.rows), "live and replayed view rows")
	require.Equal(t, live.Digest, a.res.Digest, "live and replayed digests")
}
