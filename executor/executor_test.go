package executor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestEchoResolvesWithResultCardAndTrace(t *testing.T) {
	// With a recording provider (serve installs one when OTLP export is
	// configured) the tool's span is new and the report names it.
	r := newRig(t, executor.Config{TracerProvider: sdktrace.NewTracerProvider()}, nil)
	wake, err := r.NC.SubscribeSync("cg.v1.proj.main.cmd.agent.worker.wakeup")
	require.NoError(t, err)
	parent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	c := r.dispatch(t, callOpts{tool: "echo", args: `{"text":"hi","n":[1,2]}`, traceparent: parent})
	rec, tr, card := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.JSONEq(t, `{"text":"hi","n":[1,2]}`, string(tr.Result))
	require.Nil(t, tr.Error)
	require.Equal(t, "cgledger.executor", card.Card.AuthorID)
	require.Equal(t, "echo", card.Card.FunctionName)
	require.Equal(t, c.Meta(), card.Card.Metadata, "metadata copied verbatim from the tool.call card")
	_, err = wake.NextMsg(10 * time.Second)
	require.NoError(t, err)

	reports := r.entriesOfKind(t, protocol.KindReport)
	require.Len(t, reports, 1)
	tp := nats.Header(reports[0].Headers).Get(protocol.HeaderTraceparent)
	require.True(t, protocol.ValidTraceparent(tp), tp)
	require.Equal(t, parent[3:35], tp[3:35], "same trace")
	require.NotEqual(t, parent[36:52], tp[36:52], "a new child span")
	require.Equal(t, rec.Claim.Seq, reports[0].Seq)
}

func TestOptionsDefaultsFixedEnvsAndTemplates(t *testing.T) {
	const canary = "canary-secret-7f3a9c1e"
	r := newRig(t, executor.Config{LookupEnv: func(name string) (string, bool) {
		if name == "GREET_KEY" {
			return canary, true
		}
		return "", false
	}}, nil)
	ctx := ledgertest.Ctx(t)
	_, err := r.L.RegisterToolYAML(ctx, "proj", []byte(`
tool_name: greet
parameters:
  type: object
  properties: {name: {type: string}, api_key: {type: string, minLength: 5}}
  required: [name]
target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo
after_execution: suspend
options:
  args:
    defaults: {lang: en, session_id: "{agent_turn_id}", note: "{trace_id}/{turn_epoch}"}
    fixed: {project: "{project_id}", name: overridden}
  envs: {api_key: GREET_KEY}
`))
	require.NoError(t, err)
	c := r.dispatch(t, callOpts{tool: "greet", target: "echo", args: `{"name":"x","lang":null}`})
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	var out map[string]any
	require.NoError(t, json.Unmarshal(tr.Result, &out))
	require.Nil(t, out["lang"], "an explicit null counts as given")
	require.Contains(t, out, "lang")
	require.Equal(t, c.Turn, out["session_id"])
	require.Equal(t, "trace-"+c.Turn+"/1", out["note"])
	require.Equal(t, "proj", out["project"])
	require.Equal(t, "overridden", out["name"], "fixed always overwrites")
	require.Equal(t, "[REDACTED]", out["api_key"], "the secret reached the tool but is never written")

	for _, e := range r.allEntries(t) {
		raw, _ := json.Marshal(e)
		require.NotContains(t, string(raw), canary, "entry %d", e.Seq)
		require.False(t, bytes.Contains(e.Data, []byte(canary)), "entry %d", e.Seq)
	}
	metrics, err := testutil.CollectAndFormat(r.reg, expfmt.TypeTextPlain)
	require.NoError(t, err)
	require.NotContains(t, string(metrics), canary)
}

func TestSchemaViolationsAreListedAndNotRetried(t *testing.T) {
	r := newRig(t, executor.Config{}, nil)
	_, err := r.L.RegisterToolYAML(ledgertest.Ctx(t), "proj", []byte(`
tool_name: strict
parameters:
  type: object
  properties: {query: {type: string, minLength: 3}, limit: {type: integer, maximum: 10}}
  required: [query, lang]
target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo
after_execution: terminate
determinism: pure
`))
	require.NoError(t, err)
	c := r.dispatch(t, callOpts{tool: "strict", target: "echo", args: `{"query":"ab","limit":50}`})
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, executor.ErrBadRequest, tr.Error.Code)
	d := errDetail(t, tr)
	fields := map[string]string{}
	for _, v := range d.Violations {
		fields[v.Field] = v.Code
	}
	require.Equal(t, map[string]string{"arguments.query": "minLength", "arguments.limit": "maximum", "arguments.lang": "required"}, fields)
	require.Equal(t, 0, d.Attempts, "the tool never ran")
	var res map[string]string
	require.NoError(t, json.Unmarshal(tr.Result, &res))
	require.Equal(t, executor.ErrBadRequest, res["error_code"], "result.error_code mirrors error.code")
	require.NotEmpty(t, res["error_message"])
}

func TestDeadlineResolvesAsTimeout(t *testing.T) {
	r := newRig(t, executor.Config{}, nil)
	c := r.dispatch(t, callOpts{tool: "sleep", args: `{"ms":60000}`, timeoutMS: 200})
	rec, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusTimeout, tr.Status)
	require.Equal(t, executor.ErrToolTimeout, tr.Error.Code)
	require.Equal(t, executor.CodeTimeout, errDetail(t, tr).TaxonomyCode)
	require.Equal(t, protocol.StatusTimeout, rec.Claim.Status)
	require.Equal(t, 1.0, counterSum(t, r, "cgledger_executor_deadline_expiries_total"))
}

// counterSum adds up every series of a counter in the rig's registry.
func counterSum(t *testing.T, r *rig, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func prometheusNoop() *prometheus.Registry { return prometheus.NewRegistry() }

func TestRetriesWithBackoffHonourRetryAfter(t *testing.T) {
	var calls atomic.Int32
	var times sync.Map
	flaky := executor.ToolFunc(func(_ context.Context, call *executor.Call) executor.Outcome {
		n := calls.Add(1)
		times.Store(n, time.Now())
		if n < 3 {
			return executor.Retryable("R-UPSTREAM-503", "upstream busy", 150*time.Millisecond)
		}
		return executor.Success(map[string]any{"attempt": call.Attempt})
	})
	r := newRig(t, executor.Config{}, map[string]impl{
		"flaky": {flaky, def("flaky", protocol.DeterminismIdempotent, protocol.RetryPolicy{MaxAttempts: 4, BaseMS: 1, CapMS: 5}, 4)},
	})
	c := r.dispatch(t, callOpts{tool: "flaky"})
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.JSONEq(t, `{"attempt":3}`, string(tr.Result))
	t1, _ := times.Load(int32(1))
	t2, _ := times.Load(int32(2))
	require.GreaterOrEqual(t, t2.(time.Time).Sub(t1.(time.Time)), 150*time.Millisecond, "retry_after_ms honoured")
}

func TestRetryClassesAndExhaustion(t *testing.T) {
	type counter struct{ n atomic.Int32 }
	tools := map[string]*counter{}
	mk := func(name string, o executor.Outcome, determinism string) (string, impl) {
		c := &counter{}
		tools[name] = c
		return name, impl{executor.ToolFunc(func(context.Context, *executor.Call) executor.Outcome {
			c.n.Add(1)
			return o
		}), def(name, determinism, protocol.RetryPolicy{MaxAttempts: 3, BaseMS: 1, CapMS: 2}, 4)}
	}
	extra := map[string]impl{}
	add := func(name string, im impl) { extra[name] = im }
	add(mk("auth", executor.Terminal("A-AUTH-401", "bad key", "rotate the key"), protocol.DeterminismIdempotent))
	add(mk("upstream", executor.Retryable("R-UPSTREAM-502", "bad gateway", 0), protocol.DeterminismIdempotent))
	add(mk("sidefx", executor.Retryable("R-UPSTREAM-502", "bad gateway", 0), protocol.DeterminismSideEffectful))
	add(mk("invalid", executor.Invalid("nope", protocol.Violation{Field: "arguments.x", Code: "required", Message: "is required"}), protocol.DeterminismIdempotent))
	panicky := &counter{}
	tools["panicky"] = panicky
	extra["panicky"] = impl{executor.ToolFunc(func(context.Context, *executor.Call) executor.Outcome {
		panicky.n.Add(1)
		panic("boom")
	}), def("panicky", protocol.DeterminismIdempotent, protocol.RetryPolicy{MaxAttempts: 3, BaseMS: 1, CapMS: 2}, 4)}
	r := newRig(t, executor.Config{}, extra)

	cases := []struct {
		tool, status, code, taxonomy string
		attempts                     int
	}{
		{"auth", protocol.StatusFailed, executor.ErrAuthFailed, "A-AUTH-401", 1},
		{"upstream", protocol.StatusFailed, executor.ErrUpstreamUnavailable, "R-UPSTREAM-502", 3},
		{"sidefx", protocol.StatusFailed, executor.ErrUpstreamUnavailable, "R-UPSTREAM-502", 1},
		{"invalid", protocol.StatusFailed, executor.ErrBadRequest, "I-REQ-001", 1},
		{"panicky", protocol.StatusFailed, executor.ErrInternal, executor.CodeToolPanic, 2},
	}
	for _, tc := range cases {
		t.Run(tc.tool, func(t *testing.T) {
			c := r.dispatch(t, callOpts{tool: tc.tool})
			_, tr, _ := r.result(t, c)
			require.Equal(t, tc.status, tr.Status)
			require.Equal(t, tc.code, tr.Error.Code)
			d := errDetail(t, tr)
			require.Equal(t, tc.taxonomy, d.TaxonomyCode)
			require.Equal(t, tc.attempts, d.Attempts)
			require.EqualValues(t, tc.attempts, tools[tc.tool].n.Load())
			require.NotEmpty(t, d.FixHint)
		})
	}
}

func TestCancelInFlightAndBeforePickup(t *testing.T) {
	started := make(chan string, 4)
	var runs atomic.Int32
	blocker := executor.ToolFunc(func(ctx context.Context, call *executor.Call) executor.Outcome {
		runs.Add(1)
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
	_, err := r.L.Cancel(ctx, protocol.CancelRequest{ProjectID: c.Project, AgentID: c.Agent, AgentTurnID: c.Turn, ToolCallID: c.ID, Reason: "user stop"})
	require.NoError(t, err)
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusCanceled, tr.Status)
	require.Equal(t, "canceled", tr.Error.Code)

	// Cancelled before any executor picks it up: answered without running.
	r.ex.Stop(context.Background())
	c2 := r.dispatch(t, callOpts{tool: "blocker"})
	_, err = r.L.Cancel(ctx, protocol.CancelRequest{ProjectID: c2.Project, AgentID: c2.Agent, AgentTurnID: c2.Turn, ToolCallID: c2.ID})
	require.NoError(t, err)
	r.start(t, executor.Config{Registerer: prometheusNoop()}, map[string]impl{"blocker": {blocker, def("blocker", protocol.DeterminismIdempotent, protocol.RetryPolicy{}, 4)}})
	_, tr, _ = r.result(t, c2)
	require.Equal(t, protocol.StatusCanceled, tr.Status)
	require.EqualValues(t, 1, runs.Load(), "the second call never ran")

	_, err = r.L.Cancel(ctx, protocol.CancelRequest{ProjectID: c2.Project, AgentID: c2.Agent, AgentTurnID: c2.Turn, ToolCallID: c2.ID})
	require.NoError(t, err, "cancelling again is idempotent")
}

// TestPureToolCanceledBeforePickup: a pure tool may run while its
// cancellation is read (it changes nothing), but a cancel recorded before
// the pick-up still decides the answer: canceled, whatever the run returned.
func TestPureToolCanceledBeforePickup(t *testing.T) {
	var runs atomic.Int32
	pure := executor.ToolFunc(func(ctx context.Context, call *executor.Call) executor.Outcome {
		runs.Add(1)
		return executor.Success(map[string]any{"ran": true})
	})
	tools := map[string]impl{"pure": {pure, def("pure", protocol.DeterminismPure, protocol.RetryPolicy{}, 4)}}
	r := newRig(t, executor.Config{}, tools)
	ctx := ledgertest.Ctx(t)
	r.ex.Stop(context.Background())
	c := r.dispatch(t, callOpts{tool: "pure"})
	_, err := r.L.Cancel(ctx, protocol.CancelRequest{ProjectID: c.Project, AgentID: c.Agent, AgentTurnID: c.Turn, ToolCallID: c.ID})
	require.NoError(t, err)
	r.start(t, executor.Config{Registerer: prometheusNoop()}, tools)
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusCanceled, tr.Status)
	require.Equal(t, "canceled", tr.Error.Code)
	require.LessOrEqual(t, runs.Load(), int32(1), "run at most once, its result discarded")

	// Not canceled: the same tool answers with its own result.
	c2 := r.dispatch(t, callOpts{tool: "pure"})
	_, tr, _ = r.result(t, c2)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
}

func TestBadCommandsAreAnsweredNotDropped(t *testing.T) {
	r := newRig(t, executor.Config{}, nil)
	js, err := r.NC.JetStream()
	require.NoError(t, err)
	// No identity at all: a rejection entry with every violation.
	_, err = js.PublishMsg(&nats.Msg{Subject: "cg.v1.proj.main.cmd.tool.echo", Data: []byte(`{"args":{"x":1}}`)})
	require.NoError(t, err)
	// A valid command for a call the ledger never dispatched.
	h := ledgertest.Call{Agent: "agent", Turn: "ghost-turn", ID: "ghost", Epoch: 1}.Identity().Header()
	_, err = js.PublishMsg(&nats.Msg{Subject: "cg.v1.proj.main.cmd.tool.echo", Header: h, Data: []byte(`{"tool_call_card_id":"cc","after_execution":"suspend"}`)})
	require.NoError(t, err)
	// An invalid command reusing a dispatched call's identity: answered with
	// a failed bad_request result through the report path.
	r.ex.Stop(context.Background())
	c := r.dispatch(t, callOpts{tool: "echo"})
	_, err = js.PublishMsg(&nats.Msg{Subject: "cg.v1.proj.main.cmd.tool.echo", Header: c.Identity().Header(), Data: []byte(`{"arguments":{"x":1}}`)})
	require.NoError(t, err)
	r.start(t, executor.Config{Registerer: prometheusNoop()}, nil)

	if !assert.Eventually(t, func() bool {
		return r.count(t, "cg.v1.>") > 0 && r.commandRejections(t) == 2
	}, time.Minute, 20*time.Millisecond, "both bad commands are rejected") {
		// What the ledger holds, for the next time this fails.
		for _, e := range r.entriesOfKind(t, protocol.KindRejection) {
			t.Logf("rejection seq %d %s: %s", e.Seq, e.Subject, e.Data)
		}
		t.FailNow()
	}
	var codes []string
	for _, e := range r.entriesOfKind(t, protocol.KindRejection) {
		var re protocol.RejectionEntry
		require.NoError(t, json.Unmarshal(e.Data, &re))
		if re.Op != protocol.OpCommand {
			// The valid and the invalid command for c race; the loser's
			// report is refused as a conflict, which is also recorded.
			continue
		}
		codes = append(codes, string(re.Code))
		if re.Code == protocol.CodeBadRequest {
			require.GreaterOrEqual(t, len(re.Violations), 4, "every violation: %+v", re.Violations)
		}
	}
	require.ElementsMatch(t, []string{"bad_request", "unknown_call"}, codes)
	_, tr, _ := r.result(t, c)
	// Whichever of the two commands for c came first answers it; the
	// ledger keeps exactly one report.
	require.Len(t, r.entriesOfKind(t, protocol.KindReport), 1)
	_ = tr
}

func TestUnregisteredToolAndWrongTarget(t *testing.T) {
	r := newRig(t, executor.Config{}, nil)
	c := r.dispatch(t, callOpts{tool: "nosuch", target: "echo"})
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, executor.ErrBadRequest, tr.Error.Code)
	require.Equal(t, executor.CodeUnknownTool, errDetail(t, tr).TaxonomyCode)

	c = r.dispatch(t, callOpts{tool: "echo", target: "echo.elsewhere"})
	_, tr, _ = r.result(t, c)
	require.Equal(t, "C-CONTRACT-002", errDetail(t, tr).TaxonomyCode)
}

func TestPerToolConcurrencyLimit(t *testing.T) {
	var cur, peak atomic.Int32
	release := make(chan struct{})
	slow := executor.ToolFunc(func(ctx context.Context, _ *executor.Call) executor.Outcome {
		n := cur.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		defer cur.Add(-1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return executor.Success(nil)
	})
	r := newRig(t, executor.Config{}, map[string]impl{"slow": {slow, def("slow", protocol.DeterminismPure, protocol.RetryPolicy{}, 2)}})
	var calls []ledgertest.Call
	for range 6 {
		calls = append(calls, r.dispatch(t, callOpts{tool: "slow"}))
	}
	require.Eventually(t, func() bool { return cur.Load() == 2 }, time.Minute, 5*time.Millisecond)
	close(release)
	for _, c := range calls {
		_, tr, _ := r.result(t, c)
		require.Equal(t, protocol.StatusSuccess, tr.Status)
	}
	require.EqualValues(t, 2, peak.Load(), "never more than concurrency_max at once")
}

func TestGracefulStopFinishesInFlightCalls(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	tool := executor.ToolFunc(func(ctx context.Context, _ *executor.Call) executor.Outcome {
		started <- struct{}{}
		<-release
		return executor.Success("done")
	})
	r := newRig(t, executor.Config{DrainTimeout: time.Minute}, map[string]impl{"drain": {tool, def("drain", protocol.DeterminismPure, protocol.RetryPolicy{}, 4)}})
	c := r.dispatch(t, callOpts{tool: "drain"})
	<-started
	stopped := make(chan struct{})
	go func() { r.ex.Stop(context.Background()); close(stopped) }()
	close(release)
	<-stopped
	r.L.Flush()
	rec, err := r.L.GetCall(context.Background(), c.Project, c.Turn, c.ID)
	require.NoError(t, err)
	require.Equal(t, protocol.StateWoken, rec.State, "the in-flight call was reported before Stop returned")
}

func TestExecutorMetricsPassPromlint(t *testing.T) {
	r := newRig(t, executor.Config{}, nil)
	c := r.dispatch(t, callOpts{tool: "echo"})
	r.result(t, c)
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	require.NotEmpty(t, mfs)
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)
	require.True(t, strings.Contains(func() string { b, _ := json.Marshal(mfs); return string(b) }(), "cgledger_executor_calls_total"))
}

func TestHeartbeatsKeepLongCallsFromRedelivery(t *testing.T) {
	var runs atomic.Int32
	long := executor.ToolFunc(func(ctx context.Context, _ *executor.Call) executor.Outcome {
		runs.Add(1)
		timer := time.NewTimer(2500 * time.Millisecond)
		defer timer.Stop()
		select {
		case <-timer.C:
			return executor.Success("done")
		case <-ctx.Done():
			return executor.Retryable(executor.CodeTimeout, "interrupted", 0)
		}
	})
	// AckWait is far shorter than the call: only heartbeats keep JetStream
	// from handing the command to a second run.
	r := newRig(t, executor.Config{AckWait: 600 * time.Millisecond}, map[string]impl{"long": {long, def("long", protocol.DeterminismIdempotent, protocol.RetryPolicy{}, 4)}})
	c := r.dispatch(t, callOpts{tool: "long"})
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.EqualValues(t, 1, runs.Load(), "never run twice")
	require.Zero(t, counterSum(t, r, "cgledger_executor_redeliveries_total"))
}

// TestToolSpanRecordsAFailedCall: a call that times out ends its tool span
// with status error and the call's status and code as attributes.
func TestToolSpanRecordsAFailedCall(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	r := newRig(t, executor.Config{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))}, nil)
	c := r.dispatch(t, callOpts{tool: "sleep", args: `{"ms":5000}`, timeoutMS: 100, traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusTimeout, tr.Status)
	require.Eventually(t, func() bool { return len(rec.Ended()) > 0 }, time.Minute, 10*time.Millisecond, "the tool span ends")
	span := rec.Ended()[0]
	require.Equal(t, "cgledger.tool sleep", span.Name())
	require.Equal(t, codes.Error, span.Status().Code)
	attrs := map[string]string{}
	for _, kv := range span.Attributes() {
		attrs[string(kv.Key)] = kv.Value.AsString()
	}
	require.Equal(t, protocol.StatusTimeout, attrs["cgledger.status"])
	require.NotEmpty(t, attrs["cgledger.code"])
}

// TestDeadlineExpiriesStartAtZeroForEveryImplementation: each
// implementation's tool has its cgledger_executor_deadline_expiries_total
// series at 0 before its first call, so increase() counts the first
// expiry.
func TestDeadlineExpiriesStartAtZeroForEveryImplementation(t *testing.T) {
	r := newRig(t, executor.Config{}, nil)
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	seen := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "cgledger_executor_deadline_expiries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			seen[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	for _, tool := range []string{"echo", "sleep"} {
		v, ok := seen[tool]
		require.True(t, ok, "deadline expiries of %s exist before any call", tool)
		require.Zero(t, v)
	}
}
