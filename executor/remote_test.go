package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestAnExecutorInAnotherProcessRunsOnTheClient: an executor whose ledger
// is a client.Client makes every read and write over the API, and calls come
// out as they do in process: a call answered with its result card, a call
// canceled before it ran answered canceled without running, and a command
// that does not validate recorded as refused with every violation.
func TestAnExecutorInAnotherProcessRunsOnTheClient(t *testing.T) {
	r := newRemoteRig(t, executor.Config{}, nil)

	c := r.dispatch(t, callOpts{tool: "echo", args: `{"text":"over the wire"}`})
	rec, tr, card := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	require.JSONEq(t, `{"text":"over the wire"}`, string(tr.Result))
	require.Equal(t, "cgledger.executor", card.Card.AuthorID)

	// Canceled before the executor sees it: the executor reads the
	// cancellation (cancel.get) and answers without running the tool.
	r.ex.Stop(ledgertest.Ctx(t))
	canceled := r.dispatch(t, callOpts{tool: "echo", args: `{"text":"never"}`})
	_, err := r.L.Cancel(ledgertest.Ctx(t), protocol.CancelRequest{ProjectID: canceled.Project, AgentID: canceled.Agent,
		AgentTurnID: canceled.Turn, ToolCallID: canceled.ID})
	require.NoError(t, err)
	js, err := r.NC.JetStream()
	require.NoError(t, err)
	_, err = js.PublishMsg(&nats.Msg{Subject: "cg.v1.proj.main.cmd.tool.echo", Data: []byte(`{"args":{"x":1}}`)})
	require.NoError(t, err)
	r.start(t, executor.Config{Registerer: prometheusNoop()}, nil)

	rec, _, _ = r.result(t, canceled)
	require.Equal(t, protocol.StatusCanceled, rec.Claim.Status)
	require.Eventually(t, func() bool { return r.commandRejections(t) == 1 }, time.Minute, 20*time.Millisecond)
	for _, e := range r.entriesOfKind(t, protocol.KindRejection) {
		var re protocol.RejectionEntry
		require.NoError(t, json.Unmarshal(e.Data, &re))
		if re.Op != protocol.OpCommand {
			continue
		}
		require.Equal(t, protocol.CodeBadRequest, re.Code)
		require.GreaterOrEqual(t, len(re.Violations), 4, "every violation: %+v", re.Violations)
		require.Equal(t, "echo", nats.Header(e.Headers).Get(protocol.HeaderActor), "recorded over the API, as the command's tool")
	}
}

// TestAnExecutorOnAToolCredentialPullsTheLedgersConsumer: bound to a tool of
// a project (Config.Bindings), an executor in another process runs on that
// tool's credential alone. It pulls the consumer the ledger keeps for the
// tool, hears the project's cancellations, and NATS refuses none of what it
// does.
func TestAnExecutorOnAToolCredentialPullsTheLedgersConsumer(t *testing.T) {
	r := apiRig(t, ledgertest.NewAuth(t))
	ctx := ledgertest.Ctx(t)
	d := def("blocker", protocol.DeterminismIdempotent, protocol.RetryPolicy{}, 4)
	d.ProjectID = "proj"
	_, err := r.L.RegisterTool(ctx, d)
	require.NoError(t, err)

	cred := r.Srv.Issue(t, auth.Grant{Role: auth.RoleTool, Project: "proj", Tool: "blocker"}, time.Hour)
	var mu sync.Mutex
	var refused []string
	nc, err := r.Srv.Dial(nats.UserJWTAndSeed(cred.JWT, cred.Seed), nats.CustomInboxPrefix(cred.InboxPrefix),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			refused = append(refused, err.Error())
			mu.Unlock()
		}))
	require.NoError(t, err)
	r.conn, r.remote = nc, client.New(nc, client.WithActor("blocker"))

	started := make(chan string, 4)
	blocker := executor.ToolFunc(func(ctx context.Context, call *executor.Call) executor.Outcome {
		if call.ArgString("mode") != "block" {
			return executor.Success(map[string]any{"ran": call.ToolCallID})
		}
		started <- call.ToolCallID
		<-ctx.Done()
		return executor.Retryable("R-UPSTREAM-NET", "interrupted", 0)
	})
	r.start(t, executor.Config{Bindings: []executor.Binding{{Project: "proj", Tool: "blocker"}}},
		map[string]impl{"blocker": {blocker, nil}})

	c := r.dispatch(t, callOpts{tool: "blocker"})
	rec, tr, card := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	require.JSONEq(t, `{"ran":"`+c.ID+`"}`, string(tr.Result))
	require.Equal(t, "cgledger.executor", card.Card.AuthorID)

	// A running call hears its cancellation on the project's subject the
	// credential may subscribe to.
	c2 := r.dispatch(t, callOpts{tool: "blocker", args: `{"mode":"block"}`})
	select {
	case id := <-started:
		require.Equal(t, c2.ID, id)
	case <-time.After(time.Minute):
		t.Fatal("tool never started")
	}
	_, err = r.L.Cancel(ctx, protocol.CancelRequest{ProjectID: c2.Project, AgentID: c2.Agent, AgentTurnID: c2.Turn, ToolCallID: c2.ID})
	require.NoError(t, err)
	_, tr, _ = r.result(t, c2)
	require.Equal(t, protocol.StatusCanceled, tr.Status)

	// The reports went over the API as the tool, and NATS refused nothing
	// (its refusals reach the error handler before a flush returns).
	for _, e := range r.entriesOfKind(t, protocol.KindReport) {
		require.Equal(t, "blocker", nats.Header(e.Headers).Get(protocol.HeaderActor))
	}
	require.NoError(t, nc.Flush())
	mu.Lock()
	require.Empty(t, refused)
	mu.Unlock()
}

// TestBindingsNameRegisteredImplementations: every binding that names no
// registered implementation or no project is listed, before anything is
// asked of the ledger.
func TestBindingsNameRegisteredImplementations(t *testing.T) {
	e := ledgertest.New(t)
	ex, err := executor.New(e.L, e.NC, executor.Config{Registerer: prometheus.NewRegistry(),
		Bindings: []executor.Binding{{Project: "proj", Tool: "nope"}, {Project: "bad project", Tool: "echo"}}})
	require.NoError(t, err)
	require.NoError(t, executor.RegisterBuiltins(ex))
	err = ex.Start(ledgertest.Ctx(t))
	require.ErrorContains(t, err, `bindings[0].tool "nope" is not a registered implementation`)
	require.ErrorContains(t, err, `bindings[1].project "bad project" is not an identifier`)
}

// credConn dials under a credential of g and collects what NATS refuses it.
type credConn struct {
	nc      *nats.Conn
	mu      sync.Mutex
	refused []string
}

func dialCred(t *testing.T, r *rig, g auth.Grant) *credConn {
	t.Helper()
	c := &credConn{}
	cred := r.Srv.Issue(t, g, time.Hour)
	nc, err := r.Srv.Dial(nats.UserJWTAndSeed(cred.JWT, cred.Seed), nats.CustomInboxPrefix(cred.InboxPrefix),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			c.refused = append(c.refused, err.Error())
			c.mu.Unlock()
		}))
	require.NoError(t, err)
	c.nc = nc
	return c
}

// deniedOn waits until NATS reports a permission violation naming subject.
func (c *credConn) deniedOn(t *testing.T, subject string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, e := range c.refused {
			if strings.Contains(e, "Permissions Violation") && strings.Contains(e, `"`+subject+`"`) {
				return true
			}
		}
		return false
	}, time.Minute, 10*time.Millisecond, "no permission violation for %s", subject)
}

// TestAPMOBuiltInIsServedOnItsToolCredential: a PMO built-in is served on a
// tool credential issued for its name. A worker dispatches on
// cmd.sys.pmo.internal.delegate_async; an executor in another process, on
// that credential alone, gets the built-in's consumer from tool.consumer,
// pulls the command, writes the result card and reports; the worker gets
// its wakeup and reads the outcome. Another tool's credential and the same
// built-in's credential of another project can neither subscribe to those
// commands nor pull that consumer.
func TestAPMOBuiltInIsServedOnItsToolCredential(t *testing.T) {
	r := apiRig(t, ledgertest.NewAuth(t))
	ctx := ledgertest.Ctx(t)
	const pmo = "delegate_async"

	svc := dialCred(t, r, auth.Grant{Role: auth.RoleTool, Project: "proj", Tool: pmo})
	r.conn, r.remote = svc.nc, client.New(svc.nc, client.WithActor(pmo))
	pmoDef := &protocol.ToolDefinition{ToolName: pmo, Parameters: json.RawMessage(`{"type":"object"}`),
		TargetSubject:  "cg.v1.{project_id}.{channel_id}.cmd.sys.pmo.internal." + pmo,
		AfterExecution: protocol.AfterSuspend,
		Limits:         protocol.ToolLimits{TimeoutMSDefault: 10_000, TimeoutMSMax: 60_000, ConcurrencyMax: 4},
		Determinism:    protocol.DeterminismIdempotent}
	delegate := executor.ToolFunc(func(_ context.Context, call *executor.Call) executor.Outcome {
		return executor.Success(map[string]any{"delegated": call.ToolCallID, "step": call.StepID})
	})
	r.start(t, executor.Config{Bindings: []executor.Binding{{Project: "proj", Tool: pmo}}}, map[string]impl{pmo: {delegate, pmoDef}})

	worker := dialCred(t, r, auth.Grant{Role: auth.RoleWorker, Project: "proj", Agent: "agent", Target: "worker"})
	wakeups := make(chan *nats.Msg, 4)
	_, err := worker.nc.ChanSubscribe("cg.v1.proj.*.cmd.agent.worker.wakeup", wakeups)
	require.NoError(t, err)
	require.NoError(t, worker.nc.Flush())
	wc := client.New(worker.nc, client.WithActor("agent"))
	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-pmo", ID: "call-pmo", Epoch: 1, Tool: pmo}
	req := c.Dispatch()
	req.Subject = protocol.PMOCommandSubject("v1", "proj", "main", pmo)
	req.Identity.StepID = "step-pmo"
	_, err = wc.Dispatch(ctx, req)
	require.NoError(t, err)

	select {
	case m := <-wakeups:
		require.Equal(t, "call-pmo", m.Header.Get(protocol.HeaderToolCallID))
	case <-time.After(time.Minute):
		t.Fatal("the worker got no wakeup for its PMO call")
	}
	rec, err := wc.GetCall(ctx, "proj", c.Turn, c.ID)
	require.NoError(t, err)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	card, err := r.L.GetCard(ctx, "proj", rec.Claim.ToolResultCardID)
	require.NoError(t, err)
	tr, err := card.Card.ToolResult()
	require.NoError(t, err)
	require.JSONEq(t, `{"delegated":"call-pmo","step":"step-pmo"}`, string(tr.Result))
	for _, e := range r.entriesOfKind(t, protocol.KindReport) {
		require.Equal(t, pmo, nats.Header(e.Headers).Get(protocol.HeaderActor), "reported over the API as the PMO tool")
	}
	// A command that does not validate (no CG-Step-Id, no tool_call_card_id)
	// is recorded as refused, over the API, as the PMO tool.
	js, err := r.NC.JetStream()
	require.NoError(t, err)
	_, err = js.PublishMsg(&nats.Msg{Subject: protocol.PMOCommandSubject("v1", "proj", "main", pmo), Data: []byte(`{"args":{"x":1}}`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.commandRejections(t) == 1 }, time.Minute, 20*time.Millisecond)
	for _, e := range r.entriesOfKind(t, protocol.KindRejection) {
		var re protocol.RejectionEntry
		require.NoError(t, json.Unmarshal(e.Data, &re))
		if re.Op == protocol.OpCommand {
			require.Equal(t, pmo, nats.Header(e.Headers).Get(protocol.HeaderActor))
		}
	}
	require.NoError(t, svc.nc.Flush())
	svc.mu.Lock()
	require.Empty(t, svc.refused, "NATS refused the PMO tool's credential nothing")
	svc.mu.Unlock()

	// Its consumer is the PMO tool's alone.
	consumer := auth.ToolConsumerName("proj", pmo)
	next := auth.ToolJSAPIPrefix + ".CONSUMER.MSG.NEXT." + auth.DefaultStream + "." + consumer
	for _, g := range []auth.Grant{
		{Role: auth.RoleTool, Project: "proj", Tool: "blocker"},
		{Role: auth.RoleTool, Project: "other", Tool: pmo},
	} {
		other := dialCred(t, r, g)
		_, err := other.nc.SubscribeSync("cg.v1.proj.main.cmd.sys.pmo.internal." + pmo)
		require.NoError(t, err)
		require.NoError(t, other.nc.PublishRequest(next, other.nc.NewRespInbox(), []byte(`{"batch":1}`)))
		other.deniedOn(t, "cg.v1.proj.main.cmd.sys.pmo.internal."+pmo)
		other.deniedOn(t, next)
	}
	// The same built-in's credential of another project gets that
	// project's consumer.
	elsewhere := dialCred(t, r, auth.Grant{Role: auth.RoleTool, Project: "other", Tool: pmo})
	tc, err := client.New(elsewhere.nc, client.WithActor(pmo)).EnsureToolConsumer(ctx, "other", pmo)
	require.NoError(t, err)
	require.Equal(t, auth.ToolConsumerName("other", pmo), tc.Consumer)
	require.Equal(t, []string{"cg.v1.other.*.cmd.sys.pmo.internal." + pmo}, tc.FilterSubjects)
}

// TestExecutorToolLabelsAreRegisteredOrBuiltIn: calls to names nobody
// registered, sent to a built-in's target, are counted under
// toollabels.Other in every executor family with a tool label, on an
// executor in process (the ledger's labels) and in another process (its
// own); echo keeps its name.
func TestExecutorToolLabelsAreRegisteredOrBuiltIn(t *testing.T) {
	for _, remote := range []bool{false, true} {
		var r *rig
		if remote {
			// Every call here targets echo, so echo is the actor of every
			// report (the client's default, the source function, would
			// name the unknown tool).
			r = apiRig(t, ledgertest.New(t))
			r.conn = r.Srv.Connect(t)
			r.remote = client.New(r.conn, client.WithActor("echo"))
			r.start(t, executor.Config{}, nil)
		} else {
			r = newRig(t, executor.Config{}, nil)
		}
		var calls []ledgertest.Call
		for i := range 20 {
			calls = append(calls, r.dispatch(t, callOpts{tool: fmt.Sprintf("acc-secret-%d", i), target: "echo"}))
		}
		calls = append(calls, r.dispatch(t, callOpts{tool: "echo", args: `{"x":1}`}))
		for _, c := range calls {
			r.result(t, c)
		}
		seen := map[string]bool{}
		require.Eventually(t, func() bool {
			mfs, err := r.reg.Gather()
			require.NoError(t, err)
			clear(seen)
			var n float64
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					for _, lp := range m.GetLabel() {
						if lp.GetName() == "tool" {
							seen[lp.GetValue()] = true
							if mf.GetName() == "cgledger_executor_calls_total" {
								n += m.GetCounter().GetValue()
							}
						}
					}
				}
			}
			return n == float64(len(calls))
		}, time.Minute, 20*time.Millisecond, "every call counted")
		// The calls' labels are echo and _other; sleep, the executor's other
		// built-in, has its series at 0 from the start. No made-up name is
		// a label.
		require.Equal(t, map[string]bool{"echo": true, "sleep": true, toollabels.Other: true}, seen, "remote: %v", remote)
	}
}

// TestABoundExecutorHeartbeatsByItsConsumersAckWait: bound to a consumer
// whose ack wait (the ledger's ToolAckWait, serve's tool_ack_wait) is
// shorter than Config.AckWait, the executor heartbeats by the consumer's:
// a call of two and a half ack waits is delivered once (run once). Such a
// binding used to be refused: heartbeats by Config.AckWait (5 s, every
// 1.7 s) would have let the consumer deliver the call again while it ran.
func TestABoundExecutorHeartbeatsByItsConsumersAckWait(t *testing.T) {
	r := apiRig(t, ledgertest.NewWithConfig(t, ledger.Config{ToolAckWait: time.Second}))
	d := def("longish", protocol.DeterminismIdempotent, protocol.RetryPolicy{}, 4)
	d.ProjectID = "proj"
	_, err := r.L.RegisterTool(ledgertest.Ctx(t), d)
	require.NoError(t, err)
	var mu sync.Mutex
	var deliveries []int
	longish := executor.ToolFunc(func(ctx context.Context, call *executor.Call) executor.Outcome {
		mu.Lock()
		deliveries = append(deliveries, call.Attempt)
		mu.Unlock()
		select {
		case <-time.After(2500 * time.Millisecond):
			return executor.Success(map[string]any{"slept_ms": 2500})
		case <-ctx.Done():
			return executor.Retryable("R-UPSTREAM-NET", "interrupted", 0)
		}
	})
	r.start(t, executor.Config{Bindings: []executor.Binding{{Project: "proj", Tool: "longish"}}},
		map[string]impl{"longish": {tool: longish, def: d}})
	c := r.dispatch(t, callOpts{tool: "longish", args: `{}`, timeoutMS: 30_000})
	rec, _, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1}, deliveries, "delivered once")
}
