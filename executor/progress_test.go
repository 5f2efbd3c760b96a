package executor_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/protocol"
)

// TestProgressIsRecordedInTheResultCard: a tool that reports progress in a
// burst and then fails has the first report and the last in its result
// card's error.detail.progress (the burst in between is rate limited); a
// tool that succeeds reads the same record from Call.ProgressLog.
func TestProgressIsRecordedInTheResultCard(t *testing.T) {
	burst := func(call *executor.Call) {
		for i := 1; i <= 30; i++ {
			call.Progress(executor.Progress{Progress: float64(i), Total: 30, Message: "step"})
		}
	}
	failing := executor.ToolFunc(func(_ context.Context, call *executor.Call) executor.Outcome {
		burst(call)
		return executor.Terminal("R-UPSTREAM-FATAL", "gave up", "")
	})
	succeeding := executor.ToolFunc(func(_ context.Context, call *executor.Call) executor.Outcome {
		burst(call)
		return executor.Success(map[string]any{"progress": call.ProgressLog()})
	})
	r := newRig(t, executor.Config{}, map[string]impl{
		"failing":    {failing, def("failing", protocol.DeterminismPure, protocol.RetryPolicy{MaxAttempts: 1, BaseMS: 1, CapMS: 1}, 4)},
		"succeeding": {succeeding, def("succeeding", protocol.DeterminismPure, protocol.RetryPolicy{MaxAttempts: 1, BaseMS: 1, CapMS: 1}, 4)},
	})

	_, tr, _ := r.result(t, r.dispatch(t, callOpts{tool: "failing"}))
	require.Equal(t, protocol.StatusFailed, tr.Status)
	var d struct {
		Progress []executor.Progress `json:"progress"`
	}
	require.NoError(t, json.Unmarshal(tr.Error.Detail, &d))
	require.Len(t, d.Progress, 2, "the first report, then the latest (the burst in between is rate limited)")
	require.EqualValues(t, 1, d.Progress[0].Progress)
	require.EqualValues(t, 30, d.Progress[1].Progress)
	require.EqualValues(t, 30, d.Progress[1].Total)
	require.Equal(t, "step", d.Progress[1].Message)
	require.Positive(t, d.Progress[1].AtUnixMS)

	_, tr, _ = r.result(t, r.dispatch(t, callOpts{tool: "succeeding"}))
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	var out struct {
		Progress []executor.Progress `json:"progress"`
	}
	require.NoError(t, json.Unmarshal(tr.Result, &out))
	require.Len(t, out.Progress, 2)
	require.EqualValues(t, 30, out.Progress[1].Progress)
}

// TestToolUnavailableFromATool: a tool that answers S-TOOL-UNAVAILABLE (its
// upstream is down) ends failed / upstream_unavailable, as the ledger's own
// fail-fast answer does, after the one retry of an S-TOOL fault.
func TestToolUnavailableFromATool(t *testing.T) {
	down := executor.ToolFunc(func(context.Context, *executor.Call) executor.Outcome {
		return executor.Retryable(protocol.CodeToolUnavailable, "the upstream is down", 0)
	})
	r := newRig(t, executor.Config{}, map[string]impl{
		"down": {down, def("down", protocol.DeterminismIdempotent, protocol.RetryPolicy{MaxAttempts: 3, BaseMS: 1, CapMS: 2}, 4)},
	})
	_, tr, _ := r.result(t, r.dispatch(t, callOpts{tool: "down"}))
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, executor.ErrUpstreamUnavailable, tr.Error.Code)
	d := errDetail(t, tr)
	require.Equal(t, protocol.CodeToolUnavailable, d.TaxonomyCode)
	require.Equal(t, 2, d.Attempts)
}
