package ledger_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// labelledCount is the value of the one series of a counter family whose
// labels are exactly want (0 when there is none).
func labelledCount(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if fmt.Sprint(got) == fmt.Sprint(want) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// reportWithError dispatches c (to echo) and reports it with a result card
// whose error.code is code.
func reportWithError(t *testing.T, l *ledger.Ledger, c call, status, code string) {
	t.Helper()
	ctx := ctxT(t)
	_, err := l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	rc := c.resultCard(status)
	rc.Content = json.RawMessage(fmt.Sprintf(`{"status":%q,"result":null,"error":{"code":%q,"message":"no"}}`, status, code))
	_, err = l.PutCard(ctx, rc)
	require.NoError(t, err)
	_, err = l.Report(ctx, c.reportReq(status, rc.CardID))
	require.NoError(t, err)
}

// TestToolCallsMetricCountsEveryOutcomeOnce: cgledger_tool_calls_total
// counts each call's stored report once, by tool, status and error code,
// whoever reported it: a tool (success, a recommended code, a made-up
// code), the deadline keeper and fail-fast; a duplicate report is not
// counted again. cgledger_tool_dispatches_total counts each call once,
// repeated dispatches excluded.
func TestToolCallsMetricCountsEveryOutcomeOnce(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	l.ToolLabels().AddBuiltin("echo")
	calls := func(tool, status, code string) float64 {
		return labelledCount(t, reg, "cgledger_tool_calls_total", map[string]string{"tool": tool, "status": status, "error_code": code})
	}

	ok := newCall("turn-tc", "ok", 1)
	_, err := l.Dispatch(ctx, ok.dispatchReq())
	require.NoError(t, err)
	_, err = l.Dispatch(ctx, ok.dispatchReq())
	require.NoError(t, err, "a repeated dispatch")
	rc := ok.resultCard(protocol.StatusSuccess)
	_, err = l.PutCard(ctx, rc)
	require.NoError(t, err)
	_, err = l.Report(ctx, ok.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	out, err := l.Report(ctx, ok.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.True(t, out.Duplicate)

	reportWithError(t, l, newCall("turn-tc", "bad", 1), protocol.StatusFailed, protocol.ErrorCodeBadRequest)
	reportWithError(t, l, newCall("turn-tc", "odd", 1), protocol.StatusFailed, "quota_exceeded")

	// The deadline keeper ends a call nobody answers.
	_, err = l.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: project, ToolName: "mute", Description: "never answers",
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.mute", AfterExecution: protocol.AfterSuspend,
		Parameters: json.RawMessage(`{"type":"object"}`)})
	require.NoError(t, err)
	startKeeper(t, l, 5*time.Second)
	muted, req := deadlineCall("turn-tc", "muted", "mute", 500)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	requireLedgerTimeout(t, e, l, muted)

	// Fail-fast answers a call to a tool no service pulls.
	_, err = l.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: project, ToolName: "ghost", Description: "nobody serves it",
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.ghost", AfterExecution: protocol.AfterSuspend,
		Parameters: json.RawMessage(`{"type":"object"}`), Health: &protocol.ToolHealth{FailFastAfterMS: 1},
		Limits: protocol.ToolLimits{TimeoutMSDefault: 600_000, TimeoutMSMax: 600_000}})
	require.NoError(t, err)
	ghostCalls := 0
	require.Eventually(t, func() bool {
		ghostCalls++
		_, req := deadlineCall("turn-tc", fmt.Sprintf("ghost-%d", ghostCalls), "ghost", 0)
		res, err := l.Dispatch(ctx, req)
		require.NoError(t, err)
		return res.ToolUnavailable
	}, time.Minute, 20*time.Millisecond)

	require.Equal(t, 1.0, calls("echo", protocol.StatusSuccess, "none"), "the duplicate is not counted")
	require.Equal(t, 1.0, calls("echo", protocol.StatusFailed, "bad_request"))
	require.Equal(t, 1.0, calls("echo", protocol.StatusFailed, "_other"), "a code outside the recommended set")
	require.Equal(t, 1.0, calls("mute", protocol.StatusTimeout, "tool_timeout"), "ended by the deadline keeper")
	require.Equal(t, 1.0, calls("ghost", protocol.StatusFailed, "upstream_unavailable"), "answered by fail-fast")
	require.Equal(t, 5.0, counterSum(t, reg, "cgledger_tool_calls_total"), "one per call")

	dispatches := func(tool string) float64 {
		return labelledCount(t, reg, "cgledger_tool_dispatches_total", map[string]string{"tool": tool})
	}
	require.Equal(t, 3.0, dispatches("echo"), "ok (dispatched twice), bad and odd")
	require.Equal(t, 1.0, dispatches("mute"))
	require.Equal(t, float64(ghostCalls), dispatches("ghost"))
}

// TestErrorCodeLabel: the recommended codes are their own label; no error
// is "none"; any other code is "_other".
func TestErrorCodeLabel(t *testing.T) {
	for _, code := range protocol.RecommendedErrorCodes() {
		require.Equal(t, code, ledger.ErrorCodeLabel(code))
	}
	require.Equal(t, "none", ledger.ErrorCodeLabel(""))
	require.Equal(t, "_other", ledger.ErrorCodeLabel("quota_exceeded"))
	require.Equal(t, "_other", ledger.ErrorCodeLabel("none"), "a tool's code never poses as no error")
}

// TestPerToolCountersStartAtZeroForEveryKnownTool: the counters an alert
// reads with increase() have a series for every known tool (and _other)
// before their first event, so that first event is counted.
func TestPerToolCountersStartAtZeroForEveryKnownTool(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	l.ToolLabels().Add("quiet")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	seen := map[string]map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "tool" && len(m.GetLabel()) == 1 {
					if seen[mf.GetName()] == nil {
						seen[mf.GetName()] = map[string]float64{}
					}
					seen[mf.GetName()][lp.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	for _, family := range []string{"cgledger_ledger_deadline_timeouts_total", "cgledger_ledger_tool_unavailable_total",
		"cgledger_ledger_late_reports_total", "cgledger_tool_dispatches_total"} {
		for _, tool := range []string{"quiet", toollabels.Other} {
			v, ok := seen[family][tool]
			require.True(t, ok, "%s has a series for %s before any event", family, tool)
			require.Zero(t, v, "%s{tool=%q}", family, tool)
		}
	}
}

// TestToolCallsSeriesStartAtZeroForEveryOutcome: cgledger_tool_calls_total
// has, before any call, a series at 0 for every known tool label and every
// (status, error_code) pair a call can end with (ledger.ToolCallOutcomes),
// so rate() and increase() see a tool's first outcomes (six timeouts in one
// scrape would otherwise read as none) and a tool whose calls all fail has
// an availability.
func TestToolCallsSeriesStartAtZeroForEveryOutcome(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	l.ToolLabels().Add("quiet")
	want := []string{}
	for _, tool := range []string{"quiet", toollabels.Other} {
		for _, o := range [][2]string{{"success", "none"}, {"partial", "none"}, {"failed", "bad_request"}, {"failed", "auth_failed"},
			{"failed", "upstream_unavailable"}, {"failed", "internal_error"}, {"failed", "tool_timeout"}, {"failed", "_other"},
			{"timeout", "tool_timeout"}, {"canceled", "canceled"}} {
			want = append(want, tool+"/"+o[0]+"/"+o[1])
		}
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "cgledger_tool_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			lv := map[string]string{}
			for _, lp := range m.GetLabel() {
				lv[lp.GetName()] = lp.GetValue()
			}
			got[lv["tool"]+"/"+lv["status"]+"/"+lv["error_code"]] = m.GetCounter().GetValue()
		}
	}
	for _, w := range want {
		v, ok := got[w]
		require.True(t, ok, "cgledger_tool_calls_total{%s} exists before any call", w)
		require.Zero(t, v, w)
	}
}
