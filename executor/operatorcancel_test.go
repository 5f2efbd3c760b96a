package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestOperatorCancelStopsARunningCall: an operator's call.cancel of an
// agent's call that an executor is running reaches the executor as the
// worker's cancel does: the tool's context ends and the call is reported
// canceled; another cancel then finds that one (duplicate), as a worker's
// repeated cancel does.
func TestOperatorCancelStopsARunningCall(t *testing.T) {
	started := make(chan string, 1)
	blocker := executor.ToolFunc(func(ctx context.Context, call *executor.Call) executor.Outcome {
		started <- call.ToolCallID
		<-ctx.Done()
		return executor.Retryable("R-UPSTREAM-NET", "interrupted", 0)
	})
	r := newRig(t, executor.Config{}, map[string]impl{"blocker": {blocker, def("blocker", protocol.DeterminismIdempotent, protocol.RetryPolicy{}, 4)}})
	ctx := ledgertest.Ctx(t)
	c := r.dispatch(t, callOpts{tool: "blocker"})
	select {
	case id := <-started:
		require.Equal(t, c.ID, id)
	case <-time.After(30 * time.Second):
		t.Fatal("tool never started")
	}
	res, err := r.L.OperatorCancel(ctx, "ops-anna", protocol.OperatorCancelRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, Reason: "runaway"})
	require.NoError(t, err)
	require.Equal(t, protocol.KindCancel, res.Entry)
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusCanceled, tr.Status)
	require.Equal(t, protocol.ErrorCodeCanceled, tr.Error.Code)

	again, err := r.L.OperatorCancel(ctx, "ops-bo", protocol.OperatorCancelRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, Reason: "again"})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, res.Seq, again.Seq)
}
