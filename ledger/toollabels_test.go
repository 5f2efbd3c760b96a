package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestToolLabelsAreRegisteredOrBuiltInNames: workers choose the tool names
// they dispatch to, and /metrics is open. 10,000 calls to distinct tools no
// one registered leave every family with a tool label at the registered and
// built-in names plus one value (toollabels.Other), and none of those
// names on any series.
func TestToolLabelsAreRegisteredOrBuiltInNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := ledgertest.NewWithConfig(t, ledger.Config{Registerer: reg})
	// Ten thousand calls take a while under the race detector on a loaded
	// machine: more than the minute of ledgertest.Ctx.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	reg.MustRegister(e.L.ToolCollector())
	_, err := e.L.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: "proj", ToolName: "search",
		Parameters: json.RawMessage(`{"type":"object"}`), TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.search",
		AfterExecution: protocol.AfterSuspend, SLO: &protocol.ToolSLO{SuccessRateMin: 0.99}})
	require.NoError(t, err)

	const unknown = 10_000
	calls := make([]ledgertest.Call, 0, unknown+2)
	for i := range unknown {
		calls = append(calls, ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: fmt.Sprintf("t-%d", i/50),
			ID: fmt.Sprintf("c-%d", i), Epoch: 1, Tool: fmt.Sprintf("acc-secret-%d", i)})
	}
	calls = append(calls,
		ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t-known", ID: "c-search", Epoch: 1, Tool: "search"},
		ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t-known", ID: "c-pmo", Epoch: 1, Tool: "delegate_async"})
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(calls) {
					return
				}
				c := calls[i]
				req := c.Dispatch()
				if c.Tool == "delegate_async" {
					req.Subject = protocol.PMOCommandSubject("v1", c.Project, c.Channel, c.Tool)
					req.Identity.StepID = "step-" + c.ID
				}
				_, err := e.L.Dispatch(ctx, req)
				if err == nil {
					_, err = e.L.PutCard(ctx, c.ResultCard(protocol.StatusSuccess, `{}`))
				}
				if err == nil {
					_, err = e.L.Report(ctx, c.Report(protocol.StatusSuccess))
				}
				if err != nil {
					errs <- fmt.Errorf("call %s: %w", c.ID, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	mfs, err := reg.Gather()
	require.NoError(t, err)
	allowed := map[string]bool{"search": true, toollabels.Other: true}
	for _, n := range protocol.ReservedToolNames {
		allowed[n] = true
	}
	perFamily := map[string]map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "tool" {
					continue
				}
				require.True(t, allowed[lp.GetValue()], "%s carries tool %q, neither registered nor built in", mf.GetName(), lp.GetValue())
				if perFamily[mf.GetName()] == nil {
					perFamily[mf.GetName()] = map[string]bool{}
				}
				perFamily[mf.GetName()][lp.GetValue()] = true
			}
			for _, lp := range m.GetLabel() {
				require.False(t, strings.Contains(lp.GetValue(), "acc-secret"), "%s{%s=%q}", mf.GetName(), lp.GetName(), lp.GetValue())
			}
		}
	}
	for _, name := range []string{"cgledger_call_report_latency_seconds", "cgledger_call_wakeup_latency_seconds"} {
		require.Equal(t, map[string]bool{"search": true, "delegate_async": true, toollabels.Other: true}, perFamily[name], name)
	}
	require.Equal(t, map[string]bool{"search": true}, perFamily["cgledger_tool_slo_success_min_ratio"])
	require.Equal(t, uint64(unknown), histogramSeries(t, reg, "cgledger_call_report_latency_seconds", toollabels.Other).GetHistogram().GetSampleCount())
}

func histogramSeries(t *testing.T, reg *prometheus.Registry, name, tool string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "tool" && lp.GetValue() == tool {
					return m
				}
			}
		}
	}
	t.Fatalf("no series %s{tool=%q}", name, tool)
	return nil
}

// TestToolVersionLabelsAreRegisteredVersionsOnly: a version is a label of
// its own only for a tool and version registered (or built in); a
// definition without one is "", anything else toollabels.Other.
func TestToolVersionLabelsAreRegisteredVersionsOnly(t *testing.T) {
	l := toollabels.New("echo")
	l.AddVersion("pay", "1.2.0")
	l.AddVersion("pay", "not-semver")
	l.AddVersion("bad name", "1.0.0")
	require.Equal(t, "pay", l.Label("pay"), "a registered version makes its tool known")
	require.Equal(t, "1.2.0", l.VersionLabel("pay", "1.2.0"))
	require.Equal(t, toollabels.Other, l.VersionLabel("pay", "9.9.9"))
	require.Equal(t, toollabels.Other, l.VersionLabel("pay", "not-semver"))
	require.Equal(t, toollabels.Other, l.VersionLabel("echo", "1.2.0"), "a version of another tool")
	require.Equal(t, toollabels.Other, l.VersionLabel("bad name", "1.0.0"))
	require.Equal(t, "", l.VersionLabel("echo", ""))
	require.False(t, l.Known("pay\x001.2.0") && l.Label("pay\x001.2.0") == "pay\x001.2.0", "a version key is never a tool label")
}

// TestCallToolLabelIsTheCallsOwnProjects: a name registered in one project
// is not the tool label of a call in another. An admin of project other
// dispatching to healthy (registered only in demo) must not count as
// healthy's deadline timeout (CgledgerToolNotAnswering{healthy} would page
// while demo's service is fine): such a call counts under _other in every
// family that labels a call by tool. A built-in name (Config.BuiltinTools)
// is its own label in every project.
func TestCallToolLabelIsTheCallsOwnProjects(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := ledgertest.NewWithConfig(t, ledger.Config{Registerer: reg, DeadlineGrace: -1,
		BuiltinTools: []protocol.ToolDefinition{{ToolName: "echo", Description: "built in",
			Parameters: json.RawMessage(`{"type":"object"}`), AfterExecution: protocol.AfterSuspend}}})
	ctx := ledgertest.Ctx(t)
	_, err := e.L.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: "demo", ToolName: "healthy", Description: "demo's",
		Parameters: json.RawMessage(`{"type":"object"}`), TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.healthy",
		AfterExecution: protocol.AfterSuspend})
	require.NoError(t, err)
	k, err := e.L.StartDeadlineKeeper(ctx, ledger.DeadlineKeeperConfig{AckWait: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Stop(context.Background()) })

	// demo's own call to healthy succeeds: it is healthy's.
	own := ledgertest.Call{Project: "demo", Channel: "main", Agent: "alice", Turn: "t-demo", ID: "c-own", Epoch: 1, Tool: "healthy"}
	e.Complete(t, own, protocol.StatusSuccess, `{}`)
	// other's calls to the same name: one answered, one nobody answers.
	answered := ledgertest.Call{Project: "other", Channel: "main", Agent: "bob", Turn: "t-other", ID: "c-answered", Epoch: 1, Tool: "healthy"}
	e.Complete(t, answered, protocol.StatusSuccess, `{}`)
	muted := ledgertest.Call{Project: "other", Channel: "main", Agent: "bob", Turn: "t-other", ID: "c-muted", Epoch: 1, Tool: "healthy"}
	req := muted.Dispatch()
	req.Payload.TimeoutMS = 200
	res, err := e.L.Dispatch(ctx, req)
	require.NoError(t, err)
	require.Zero(t, res.ToolDefSeq, "healthy is not registered in other")
	require.Eventually(t, func() bool {
		rec, err := e.L.GetCall(ctx, "other", muted.Turn, muted.ID)
		return err == nil && rec.Claim != nil && rec.Claim.Status == protocol.StatusTimeout
	}, time.Minute, 20*time.Millisecond, "the deadline keeper ends other's call")
	// A built-in is its own label in any project.
	builtin := ledgertest.Call{Project: "other", Channel: "main", Agent: "bob", Turn: "t-other", ID: "c-echo", Epoch: 1, Tool: "echo"}
	e.Complete(t, builtin, protocol.StatusSuccess, `{}`)

	count := func(name string, labels map[string]string) float64 {
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
				if fmt.Sprint(got) == fmt.Sprint(labels) {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	other := toollabels.Other
	require.Zero(t, count("cgledger_ledger_deadline_timeouts_total", map[string]string{"tool": "healthy"}), "demo's healthy never timed out")
	require.Equal(t, 1.0, count("cgledger_ledger_deadline_timeouts_total", map[string]string{"tool": other}))
	require.Equal(t, 1.0, count("cgledger_tool_calls_total", map[string]string{"tool": "healthy", "status": "success", "error_code": "none"}), "demo's call only")
	require.Equal(t, 1.0, count("cgledger_tool_calls_total", map[string]string{"tool": other, "status": "success", "error_code": "none"}))
	require.Equal(t, 1.0, count("cgledger_tool_calls_total", map[string]string{"tool": other, "status": "timeout", "error_code": "tool_timeout"}))
	require.Zero(t, count("cgledger_tool_calls_total", map[string]string{"tool": "healthy", "status": "timeout", "error_code": "tool_timeout"}))
	require.Equal(t, 1.0, count("cgledger_tool_calls_total", map[string]string{"tool": "echo", "status": "success", "error_code": "none"}), "a built-in in any project")
	require.Equal(t, 1.0, count("cgledger_tool_dispatches_total", map[string]string{"tool": "healthy"}))
	require.Equal(t, 2.0, count("cgledger_tool_dispatches_total", map[string]string{"tool": other}))
	require.Equal(t, uint64(1), histogramSeries(t, reg, "cgledger_call_report_latency_seconds", "healthy").GetHistogram().GetSampleCount())
	require.Equal(t, uint64(2), histogramSeries(t, reg, "cgledger_call_report_latency_seconds", other).GetHistogram().GetSampleCount())
}
