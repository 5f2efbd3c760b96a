package ledger_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/protocol"
)

func TestMetricsCountOutcomesAndPassPromlint(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	// echo is a built-in wherever serve runs (it adds echo and sleep).
	e.l.ToolLabels().AddBuiltin("echo")
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w"})
	require.NoError(t, err)
	c := newCall("turn-m", "call-m", 2)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	_, err = e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	_, err = e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	stale := c
	stale.epoch = 1
	_, err = e.l.Report(ctx, stale.reportReq(protocol.StatusSuccess, rc.CardID))
	require.ErrorIs(t, err, protocol.ErrStaleEpoch)

	// A repeated dispatch moves its own counter.
	_, err = e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)

	expected := `
# HELP cgledger_ledger_duplicate_reports_total Reports answered with the original outcome because the call was already reported.
# TYPE cgledger_ledger_duplicate_reports_total counter
cgledger_ledger_duplicate_reports_total 1
# HELP cgledger_ledger_duplicate_dispatches_total Dispatches answered with the original outcome (duplicate: true) because the call was already dispatched.
# TYPE cgledger_ledger_duplicate_dispatches_total counter
cgledger_ledger_duplicate_dispatches_total 1
# HELP cgledger_ledger_wakeups_total Wakeups published on cmd.agent.<worker_target>.wakeup (JetStream-deduplicated retries excluded).
# TYPE cgledger_ledger_wakeups_total counter
cgledger_ledger_wakeups_total 1
`
	require.NoError(t, testutil.GatherAndCompare(e.reg, strings.NewReader(expected),
		"cgledger_ledger_duplicate_reports_total", "cgledger_ledger_duplicate_dispatches_total", "cgledger_ledger_wakeups_total"))
	require.Equal(t, 1.0, counterValue(t, e, "cgledger_ledger_rejections_total", "reason", "stale_epoch"))
	require.Equal(t, 1.0, counterValue(t, e, "cgledger_ledger_appends_total", "kind", "report"))
	require.Equal(t, 1.0, counterValue(t, e, "cgledger_ledger_appends_total", "kind", "command"))
	// The accepted report's latency from dispatch, labelled by its tool.
	require.Equal(t, uint64(1), histogramCount(t, e, "cgledger_call_report_latency_seconds", "tool", "echo"))

	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	require.NotEmpty(t, mfs)
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)
}

// series finds the one series of a family whose label has that value.
func series(t *testing.T, e *env, name, label, value string) *dto.Metric {
	t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m
				}
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, label, value)
	return nil
}

// counterValue finds the value of one labelled counter series.
func counterValue(t *testing.T, e *env, name, label, value string) float64 {
	t.Helper()
	return series(t, e, name, label, value).GetCounter().GetValue()
}

// histogramCount finds the sample count of one labelled histogram series.
func histogramCount(t *testing.T, e *env, name, label, value string) uint64 {
	t.Helper()
	return series(t, e, name, label, value).GetHistogram().GetSampleCount()
}

// TestAPIMetricsCountEveryAnswer: each answered API request counts once, by
// operation and outcome, with its latency.
func TestAPIMetricsCountEveryAnswer(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	cl := client.New(e.srv.Connect(t))
	ctx := ctxT(t)
	c := newCall("turn-api-m", "call-1", 1)
	_, err := cl.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	_, err = cl.GetCall(ctx, project, c.turn, "nope")
	require.ErrorIs(t, err, protocol.ErrUnknownCall)
	require.Equal(t, 1.0, apiCount(t, e, "dispatch", "ok"))
	require.Equal(t, 1.0, apiCount(t, e, "call.get", "unknown_call"))
	require.Equal(t, uint64(1), histogramCount(t, e, "cgledger_api_request_duration_seconds", "op", "dispatch"))
}

// apiCount reads cgledger_api_requests_total{op, code}.
func apiCount(t *testing.T, e *env, op, code string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "cgledger_api_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["op"] == op && labels["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
