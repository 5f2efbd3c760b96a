package ledger_test

import (
	"strings"
	"testing"
	"time"

	"github.com/cgledger/cgledger/executor/jina"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

const searchYAML = `
tool_name: web_search
description: Search the web
parameters:
  type: object
  properties:
    query: {type: string, minLength: 1}
    session_id: {type: string}
  required: [query]
target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.http.search
after_execution: suspend
options:
  args:
    defaults: {session_id: "{agent_turn_id}"}
    fixed: {project_id: "{project_id}"}
  envs: {api_key: SEARCH_API_KEY}
  jina: {mode: search, base_url: "https://s.jina.ai", path: /search, method: GET, auth_env: JINA_API_KEY}
limits: {timeout_ms_default: 5000, timeout_ms_max: 20000, concurrency_max: 4}
determinism: idempotent
retry: {max_attempts: 4, base_ms: 100, cap_ms: 1000}
slo: {success_rate_min: 0.995, p95_latency_ms_max: 2000}
`

func TestRegisterToolFromYAMLIsVersionedAndReadable(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	r, err := e.l.RegisterToolYAML(ctx, project, []byte(searchYAML))
	require.NoError(t, err)
	require.False(t, r.Unchanged)
	got, err := e.l.GetTool(ctx, project, "web_search")
	require.NoError(t, err, "readable as soon as registration returns")
	require.Equal(t, r.Seq, got.Seq)
	d := got.Definition
	require.Equal(t, int64(5000), d.Limits.TimeoutMSDefault)
	require.Equal(t, 4, d.Limits.ConcurrencyMax)
	require.Equal(t, protocol.DeterminismIdempotent, d.Determinism)
	require.Equal(t, &protocol.ToolSLO{SuccessRateMin: 0.995, P95LatencyMSMax: 2000}, d.SLO)
	require.Equal(t, "cg.v1.proj-1.chan-9.cmd.tool.http.search", d.TargetFor(project, "chan-9"))
	opts, err := d.ParsedOptions()
	require.NoError(t, err)
	require.Equal(t, "SEARCH_API_KEY", opts.Envs["api_key"])
	j, err := jina.OptionsOf(&d)
	require.NoError(t, err)
	require.Equal(t, "search", j.Mode)
	require.JSONEq(t, `"{agent_turn_id}"`, string(opts.Args.Defaults["session_id"]))

	again, err := e.l.RegisterToolYAML(ctx, project, []byte(searchYAML))
	require.NoError(t, err)
	require.True(t, again.Unchanged)
	require.Equal(t, r.Seq, again.Seq)

	changed, err := e.l.RegisterToolYAML(ctx, project, []byte(strings.Replace(searchYAML, "description: Search the web", "description: Search, v2", 1)))
	require.NoError(t, err)
	require.Greater(t, changed.Seq, r.Seq)
	require.Len(t, e.subjectEntries(t, protocol.ToolSubject("v1", project, "web_search")), 2, "every version is an entry")

	// Defaults are filled for a minimal JSON definition.
	_, err = e.l.RegisterToolYAML(ctx, project, []byte(`{"tool_name":"echo2","parameters":{"type":"object"},"target_subject":"cg.v1.{project_id}.{channel_id}.cmd.tool.echo","after_execution":"terminate"}`))
	require.NoError(t, err)
	list, err := e.l.ListTools(ctx, project)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "echo2", list[0].Definition.ToolName)
	require.Equal(t, protocol.DeterminismSideEffectful, list[0].Definition.Determinism)
	require.EqualValues(t, protocol.DefaultTimeoutMS, list[0].Definition.Limits.TimeoutMSDefault)
	require.Equal(t, "Search, v2", list[1].Definition.Description)
}

func TestRegisterToolListsEveryViolation(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	bad := `
tool_name: fork_join
parameters: {type: array, minLength: "x"}
target_subject: cg.v1.{project_id}.{channel_id}.cmd.sys.pmo.internal.fork_join
after_execution: later
options:
  envs: {api_key: "not a name"}
  jina: {mode: crawl, base_url: "ftp://x"}
limits: {timeout_ms_default: 5000, timeout_ms_max: 1000}
determinism: maybe
slo: {success_rate_min: 1.5, p95_latency_ms_max: -3}
`
	_, err := e.l.RegisterToolYAML(ctx, project, []byte(bad))
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	le, _ := protocol.AsError(err)
	got := map[string]string{}
	for _, v := range le.Violations {
		got[v.Field] = v.Code
	}
	require.Equal(t, map[string]string{
		"tool.tool_name":              "reserved",
		"tool.parameters.type":        "invalid_value",
		"tool.parameters":             "invalid_schema",
		"tool.target_subject":         "forbidden",
		"tool.after_execution":        "invalid_value",
		"tool.options.envs.api_key":   "invalid_value",
		"tool.options.jina.mode":      "invalid_value",
		"tool.options.jina.base_url":  "invalid_value",
		"tool.determinism":            "invalid_value",
		"tool.limits.timeout_ms_max":  "invalid_value",
		"tool.slo.success_rate_min":   "invalid_value",
		"tool.slo.p95_latency_ms_max": "invalid_value",
	}, got)
	require.NotZero(t, le.Seq, "the refusal is a ledger entry")
	_, err = e.l.GetTool(ctx, project, "fork_join")
	require.ErrorIs(t, err, protocol.ErrNotFound)

	// A PMO built-in's name is no target either: it is the actor of that
	// built-in's tool credential.
	_, err = e.l.RegisterToolYAML(ctx, project, []byte(`{"tool_name":"x","parameters":{"type":"object"},"target_subject":"cg.v1.{project_id}.{channel_id}.cmd.tool.delegate_async.x","after_execution":"suspend"}`))
	le, _ = protocol.AsError(err)
	require.NotNil(t, le)
	require.Equal(t, []protocol.Violation{{Field: "tool.target_subject", Code: protocol.VReserved,
		Message: `target "delegate_async" is a PMO built-in tool name (served on cmd.sys.pmo.internal.delegate_async)`}}, le.Violations)

	_, err = e.l.RegisterToolYAML(ctx, project, []byte("tool_name: [unclosed"))
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	_, err = e.l.RegisterToolYAML(ctx, project, []byte(`{"tool_name":"x","parameters":{"type":"object"},"target_subject":"cg.v1.other.{channel_id}.cmd.tool.x","after_execution":"suspend"}`))
	le, _ = protocol.AsError(err)
	require.Equal(t, "tool.target_subject", le.Violations[0].Field)
	require.Equal(t, protocol.VMismatch, le.Violations[0].Code)
}

// TestToolCollectorExportsTimeoutsAndSLOs: every registered tool (any
// project) and built-in has its timeout as a gauge, the largest across
// projects, the protocol's 30 s when a built-in sets none (and for the PMO
// built-ins, which have no definition); a tool's SLO is
// a gauge per tool name, the strictest across projects; tools without one
// are absent from the SLO gauges.
func TestToolCollectorExportsTimeoutsAndSLOs(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	l, err := ledger.Open(ctx, e.srv.Connect(t), ledger.Config{BuiltinTools: []protocol.ToolDefinition{
		{ToolName: "echo", Limits: protocol.ToolLimits{TimeoutMSDefault: 2000}},
		{ToolName: "clock"},
	}})
	require.NoError(t, err)
	t.Cleanup(l.Close)
	_, err = e.l.RegisterToolYAML(ctx, project, []byte(searchYAML))
	require.NoError(t, err)
	stricter := strings.Replace(searchYAML, "slo: {success_rate_min: 0.995, p95_latency_ms_max: 2000}", "slo: {success_rate_min: 0.999, p95_latency_ms_max: 5000}", 1)
	stricter = strings.Replace(stricter, "timeout_ms_default: 5000", "timeout_ms_default: 8000", 1)
	_, err = e.l.RegisterToolYAML(ctx, "other-project", []byte(stricter))
	require.NoError(t, err)
	plain := strings.Replace(strings.Replace(searchYAML, "web_search", "plain", 1), "slo: {success_rate_min: 0.995, p95_latency_ms_max: 2000}\n", "", 1)
	_, err = e.l.RegisterToolYAML(ctx, project, []byte(strings.Replace(plain, "timeout_ms_default: 5000, timeout_ms_max: 20000, ", "", 1)))
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(l.ToolCollector()))
	expected := `
# HELP cgledger_tool_slo_p95_latency_max_seconds The latency SLO of a registered tool (its definition's slo.p95_latency_ms_max, in seconds); the strictest when projects differ.
# TYPE cgledger_tool_slo_p95_latency_max_seconds gauge
cgledger_tool_slo_p95_latency_max_seconds{tool="web_search"} 2
# HELP cgledger_tool_slo_success_min_ratio The availability SLO of a registered tool (its definition's slo.success_rate_min); the strictest when projects differ.
# TYPE cgledger_tool_slo_success_min_ratio gauge
cgledger_tool_slo_success_min_ratio{tool="web_search"} 0.999
# HELP cgledger_tool_timeout_seconds The default time budget of a call to a tool (its definition's limits.timeout_ms_default, else the protocol's 30 s), for every tool registered in any project and every built-in (the executor's and the PMO's); the largest when projects differ. Dashboards list the tools from it.
# TYPE cgledger_tool_timeout_seconds gauge
cgledger_tool_timeout_seconds{tool="ask_expert"} 30
cgledger_tool_timeout_seconds{tool="clock"} 30
cgledger_tool_timeout_seconds{tool="delegate_async"} 30
cgledger_tool_timeout_seconds{tool="echo"} 2
cgledger_tool_timeout_seconds{tool="fork_join"} 30
cgledger_tool_timeout_seconds{tool="launch_principal"} 30
cgledger_tool_timeout_seconds{tool="plain"} 30
cgledger_tool_timeout_seconds{tool="provision_agent"} 30
cgledger_tool_timeout_seconds{tool="web_search"} 8
`
	var last error
	require.Eventually(t, func() bool {
		// This process learns the other's registrations through its watch.
		last = testutil.GatherAndCompare(reg, strings.NewReader(expected))
		return last == nil
	}, time.Minute, 20*time.Millisecond, "%v", &last)
	// Names: every label of a tool of its own (PMO built-ins included),
	// sorted; never a version.
	l.ToolLabels().AddVersion("plain", "1.0.0")
	require.Equal(t, []string{"ask_expert", "clock", "delegate_async", "echo", "fork_join", "launch_principal", "plain", "provision_agent", "web_search"}, l.ToolLabels().Names())
}
