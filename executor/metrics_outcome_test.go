package executor_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// counterWith is the value of the series of a counter family whose labels
// include want (0 when none).
func counterWith(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue series
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestExecutorMetricsErrorClassIsNoneOnSuccess: a successful call is
// counted with error_class "none", never an empty label.
func TestExecutorMetricsErrorClassIsNoneOnSuccess(t *testing.T) {
	r := newRig(t, executor.Config{}, nil)
	c := r.dispatch(t, callOpts{tool: "echo", args: `{"text":"hi"}`})
	rec, _, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	require.Eventually(t, func() bool {
		return counterWith(t, r.reg, "cgledger_executor_calls_total", map[string]string{"tool": "echo", "status": "success", "error_class": executor.NoErrorClass}) == 1
	}, time.Minute, 20*time.Millisecond)
	require.Zero(t, counterWith(t, r.reg, "cgledger_executor_calls_total", map[string]string{"error_class": ""}))
}

// TestToolCallsMetricCountsTheExecutorsBadCommand: the executor's answer
// to a command that does not validate (through the report path) is counted
// on the ledger's side like any report: failed, bad_request, once; and an
// ordinary success as success, none.
func TestToolCallsMetricCountsTheExecutorsBadCommand(t *testing.T) {
	lreg := prometheus.NewRegistry()
	r := &rig{Env: ledgertest.NewWithConfig(t, ledger.Config{Registerer: lreg}), reg: prometheus.NewRegistry()}
	_, err := r.L.SetRoster(ledgertest.Ctx(t), protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
	require.NoError(t, err)
	r.start(t, executor.Config{}, nil)

	ok := r.dispatch(t, callOpts{tool: "echo", args: `{"text":"hi"}`})
	r.result(t, ok)
	// A call parked on a tool no executor serves, and an invalid command
	// reusing its identity where the executor takes commands.
	parked := r.dispatch(t, callOpts{tool: "parked"})
	_, err = r.JS.PublishMsg(ledgertest.Ctx(t), &nats.Msg{Subject: "cg.v1.proj.main.cmd.tool.echo", Header: parked.Identity().Header(), Data: []byte(`{"arguments":{"x":1}}`)})
	require.NoError(t, err)
	_, tr, _ := r.result(t, parked)
	require.Equal(t, executor.ErrBadRequest, tr.Error.Code)

	calls := func(tool, status, code string) float64 {
		return counterWith(t, lreg, "cgledger_tool_calls_total", map[string]string{"tool": tool, "status": status, "error_code": code})
	}
	require.Equal(t, 1.0, calls("echo", protocol.StatusSuccess, "none"))
	// parked is registered nowhere and built in nowhere: _other.
	require.Equal(t, 1.0, calls(toollabels.Other, protocol.StatusFailed, "bad_request"), "the invalid command's answer")
	require.Equal(t, 2.0, counterWith(t, lreg, "cgledger_tool_calls_total", nil), "one per call")
}
