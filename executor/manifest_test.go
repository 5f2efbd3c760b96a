package executor_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestARedeliveryRunsTheDefinitionPinnedAtDispatch: a call dispatched under
// version 1.0.0 of a tool is still running when 2.0.0 is registered and its
// executor (in another process, on the client) dies without acking. The
// redelivery, in a fresh executor that reads everything from the server,
// runs 1.0.0: the definition the call record pinned.
func TestARedeliveryRunsTheDefinitionPinnedAtDispatch(t *testing.T) {
	ctx := ledgertest.Ctx(t)
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	tool := executor.ToolFunc(func(ctx context.Context, call *executor.Call) executor.Outcome {
		if runs.Add(1) == 1 {
			close(started)
			// The first delivery does not finish before its executor dies.
			select {
			case <-ctx.Done():
			case <-release:
			}
			return executor.Success(map[string]any{"version": "never recorded"})
		}
		return executor.Success(map[string]any{"version": call.Definition.Version, "owner": call.Definition.Owner})
	})
	d := def("pinned", protocol.DeterminismIdempotent, protocol.RetryPolicy{}, 4)
	cfg := executor.Config{AckWait: time.Second}
	extra := map[string]impl{"pinned": {tool: tool, def: d}}

	r := apiRig(t, ledgertest.New(t))
	v1 := *d
	v1.ProjectID, v1.Version, v1.Owner = "proj", "1.0.0", "@team-a"
	reg1, err := r.L.RegisterTool(ctx, &v1)
	require.NoError(t, err)

	first := r.Srv.Connect(t)
	r.conn, r.remote = first, client.New(first)
	r.start(t, cfg, extra)

	c := r.dispatch(t, callOpts{tool: "pinned"})
	rec, err := r.L.GetCall(ctx, c.Project, c.Turn, c.ID)
	require.NoError(t, err)
	require.Equal(t, reg1.Seq, rec.ToolDefSeq, "the call pins the definition in force at dispatch")
	require.Equal(t, "1.0.0", rec.ToolVersion)
	select {
	case <-started:
	case <-time.After(time.Minute):
		t.Fatal("the first delivery never ran")
	}

	v2 := v1
	v2.Version, v2.Owner = "2.0.0", "@team-b"
	reg2, err := r.L.RegisterTool(ctx, &v2)
	require.NoError(t, err)
	require.NotEqual(t, reg1.Seq, reg2.Seq)

	// The executor dies: its connection goes, nothing is acked.
	first.Close()
	close(release)
	second := r.Srv.Connect(t)
	r.conn, r.remote = second, client.New(second)
	r.start(t, executor.Config{AckWait: time.Second, Registerer: prometheusNoop()}, extra)

	rec, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	require.JSONEq(t, `{"version":"1.0.0","owner":"@team-a"}`, string(tr.Result), "the redelivery ran the pinned definition")
	require.Equal(t, int32(2), runs.Load())

	// A call dispatched now pins 2.0.0.
	c2 := r.dispatch(t, callOpts{tool: "pinned"})
	_, tr2, _ := r.result(t, c2)
	require.JSONEq(t, `{"version":"2.0.0","owner":"@team-b"}`, string(tr2.Result))
}

// TestAResultThatBreaksTheResultSchemaFails: the tool's result is held to
// its result_schema; a mismatch ends the call failed with C-CONTRACT-RESULT,
// every violation listed, and what the tool returned kept in
// error.detail.result.
func TestAResultThatBreaksTheResultSchemaFails(t *testing.T) {
	ctx := ledgertest.Ctx(t)
	out := atomic.Value{}
	tool := executor.ToolFunc(func(context.Context, *executor.Call) executor.Outcome {
		return executor.Success(out.Load())
	})
	d := def("shaped", protocol.DeterminismPure, protocol.RetryPolicy{}, 4)
	r := newRig(t, executor.Config{}, map[string]impl{"shaped": {tool: tool, def: d}})
	reg := *d
	reg.ProjectID, reg.Version = "proj", "1.2.0"
	reg.ResultSchema = json.RawMessage(`{"type":"object","required":["n","label"],"properties":{"n":{"type":"integer","minimum":0},"label":{"type":"string"}}}`)
	_, err := r.L.RegisterTool(ctx, &reg)
	require.NoError(t, err)

	out.Store(map[string]any{"n": -1, "extra": true})
	c := r.dispatch(t, callOpts{tool: "shaped"})
	rec, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusFailed, rec.Claim.Status)
	require.Equal(t, "bad_request", tr.Error.Code)
	d2 := errDetail(t, tr)
	require.Equal(t, protocol.CodeResultContract, d2.TaxonomyCode)
	require.ElementsMatch(t, []string{"result.label", "result.n"}, fields(d2.Violations), "every violation: %+v", d2.Violations)
	var kept struct {
		Result map[string]any `json:"result"`
	}
	require.NoError(t, json.Unmarshal(tr.Error.Detail, &kept))
	require.Equal(t, map[string]any{"n": -1.0, "extra": true}, kept.Result, "the card keeps what the tool said")

	out.Store(map[string]any{"n": 3, "label": "ok"})
	c = r.dispatch(t, callOpts{tool: "shaped"})
	rec, tr, _ = r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	require.JSONEq(t, `{"n":3,"label":"ok"}`, string(tr.Result))

	// The executor's calls carry the registered version as a label.
	require.Eventually(t, func() bool {
		mfs, err := r.reg.Gather()
		require.NoError(t, err)
		var n float64
		for _, mf := range mfs {
			if mf.GetName() != "cgledger_executor_calls_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				if labels["tool"] == "shaped" && labels["tool_version"] == "1.2.0" {
					n += m.GetCounter().GetValue()
				}
			}
		}
		return n == 2
	}, time.Minute, 20*time.Millisecond, "both calls counted under tool_version 1.2.0")
}

func fields(vs []protocol.Violation) []string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, v.Field)
	}
	return out
}

// TestFailFastAnswersAtOnceWhenNoServicePulls: a tool with
// health.fail_fast_after_ms that nobody serves is answered at dispatch,
// failed with S-TOOL-UNAVAILABLE, instead of waiting out its deadline; once
// an executor serves it, the next call runs.
func TestFailFastAnswersAtOnceWhenNoServicePulls(t *testing.T) {
	ctx := ledgertest.Ctx(t)
	r := &rig{Env: ledgertest.New(t), reg: prometheusNoop()}
	_, err := r.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
	require.NoError(t, err)
	// As in serve: the ledger's deadline keeper takes every tool's commands
	// and the views read the whole stream, both always pulling; neither
	// serves the tool (found from outside: they kept it "available").
	keeper, err := r.L.StartDeadlineKeeper(ctx, ledger.DeadlineKeeperConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = keeper.Stop(context.Background()) })
	js, err := jetstream.New(r.NC)
	require.NoError(t, err)
	views, err := js.OrderedConsumer(ctx, r.L.StreamName(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	cc, err := views.Consume(func(jetstream.Msg) {})
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	d := def("ghost", protocol.DeterminismPure, protocol.RetryPolicy{}, 4)
	reg := *d
	reg.ProjectID = "proj"
	reg.Limits.TimeoutMSDefault, reg.Limits.TimeoutMSMax = 600_000, 600_000 // waiting it out would take ten minutes
	reg.Health = &protocol.ToolHealth{FailFastAfterMS: 300}
	_, err = r.L.RegisterTool(ctx, &reg)
	require.NoError(t, err)

	// Calls dispatched within 300 ms of the registration are published and
	// wait; the first one after is answered at once.
	var c ledgertest.Call
	var dispatched time.Time
	require.Eventually(t, func() bool {
		dispatched = time.Now()
		var res protocol.DispatchResult
		c, res = r.dispatchResult(t, callOpts{tool: "ghost"})
		return res.ToolUnavailable
	}, time.Minute, 50*time.Millisecond)
	rec, tr, card := r.result(t, c)
	require.Less(t, time.Since(dispatched), 300*time.Millisecond+time.Minute, "answered without waiting for the deadline")
	require.Equal(t, protocol.StatusFailed, rec.Claim.Status)
	require.Equal(t, protocol.CodeToolUnavailable, errDetail(t, tr).TaxonomyCode)
	require.Equal(t, "cgledger.ledger", card.Card.AuthorID)

	// A service starts: once it pulls, the next call is served.
	r.start(t, executor.Config{}, map[string]impl{"ghost": {tool: executor.ToolFunc(func(context.Context, *executor.Call) executor.Outcome {
		return executor.Success(map[string]any{"served": true})
	}), def: d}})
	require.Eventually(t, func() bool {
		var res protocol.DispatchResult
		c, res = r.dispatchResult(t, callOpts{tool: "ghost"})
		return !res.ToolUnavailable
	}, time.Minute, 50*time.Millisecond)
	rec, tr, _ = r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	require.JSONEq(t, `{"served":true}`, string(tr.Result))
}

// TestFailFastSeesAToolServiceOnItsCredential: a tool served by a service
// in another process, on the tool's credential, pulls the consumer the
// ledger keeps for the tool (tool.consumer): until it pulls, calls are
// answered S-TOOL-UNAVAILABLE at dispatch; once it pulls, they are served.
func TestFailFastSeesAToolServiceOnItsCredential(t *testing.T) {
	r := apiRig(t, ledgertest.NewAuth(t))
	ctx := ledgertest.Ctx(t)
	d := def("remote", protocol.DeterminismIdempotent, protocol.RetryPolicy{}, 4)
	d.ProjectID = "proj"
	d.Health = &protocol.ToolHealth{FailFastAfterMS: 300}
	_, err := r.L.RegisterTool(ctx, d)
	require.NoError(t, err)

	var c ledgertest.Call
	require.Eventually(t, func() bool {
		var res protocol.DispatchResult
		c, res = r.dispatchResult(t, callOpts{tool: "remote"})
		return res.ToolUnavailable
	}, time.Minute, 50*time.Millisecond)
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.CodeToolUnavailable, errDetail(t, tr).TaxonomyCode)

	cred := r.Srv.Issue(t, auth.Grant{Role: auth.RoleTool, Project: "proj", Tool: "remote"}, time.Hour)
	nc, err := r.Srv.Dial(nats.UserJWTAndSeed(cred.JWT, cred.Seed), nats.CustomInboxPrefix(cred.InboxPrefix))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	r.conn, r.remote = nc, client.New(nc, client.WithActor("remote"))
	r.start(t, executor.Config{Bindings: []executor.Binding{{Project: "proj", Tool: "remote"}}},
		map[string]impl{"remote": {executor.ToolFunc(func(_ context.Context, call *executor.Call) executor.Outcome {
			return executor.Success(map[string]any{"ran": call.ToolCallID})
		}), nil}})
	require.Eventually(t, func() bool {
		var res protocol.DispatchResult
		c, res = r.dispatchResult(t, callOpts{tool: "remote"})
		return !res.ToolUnavailable
	}, time.Minute, 50*time.Millisecond)
	rec, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	require.JSONEq(t, `{"ran":"`+c.ID+`"}`, string(tr.Result))
}
