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

// TestFullStoreNeverLosesAnAcknowledgedCall fills the ledger stream while a
// call runs: its outcome cannot be written, through more deliveries than
// MaxDeliver allows. JetStream must not drop the command; once space
// returns the call resolves, with exactly one report.
func TestFullStoreNeverLosesAnAcknowledgedCall(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	tool := executor.ToolFunc(func(ctx context.Context, _ *executor.Call) executor.Outcome {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		return executor.Success("done")
	})
	r := newRig(t, executor.Config{MaxDeliver: 2}, map[string]impl{"slow": {tool, def("slow", protocol.DeterminismPure, protocol.RetryPolicy{}, 4)}})
	ctx := ledgertest.Ctx(t)
	c := r.dispatch(t, callOpts{tool: "slow"})
	<-started

	stream, err := r.JS.Stream(ctx, r.L.StreamName())
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	full := info.Config
	full.MaxBytes = int64(info.State.Bytes)
	_, err = r.JS.UpdateStream(ctx, full)
	require.NoError(t, err)
	close(release)

	// The outcome cannot be stored: the command comes back again and again,
	// past MaxDeliver, and the call stays unreported.
	require.Eventually(t, func() bool {
		return metricValue(t, r, "cgledger_executor_transient_failures_total") >= 3
	}, time.Minute, 10*time.Millisecond, "the executor keeps retrying the write")
	rec, err := r.L.GetCall(ctx, c.Project, c.Turn, c.ID)
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State)

	full.MaxBytes = -1
	_, err = r.JS.UpdateStream(ctx, full)
	require.NoError(t, err)
	rec, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StateWoken, rec.State)
	// Whether the tool's own result or the redelivery bound's failure was
	// written first, there is one report.
	require.Contains(t, []string{protocol.StatusSuccess, protocol.StatusFailed}, tr.Status)
	require.Equal(t, 1, r.count(t, protocol.ReportSubject("v1", c.Project, c.Channel, c.Turn, c.ID)))
}

// metricValue sums a counter's samples in the rig's registry.
func metricValue(t *testing.T, r *rig, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}
