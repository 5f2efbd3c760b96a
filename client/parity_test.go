package client_test

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// Both serve an executor: one in process, one in another process.
var (
	_ executor.Ledger = (*ledger.Ledger)(nil)
	_ executor.Ledger = (*client.Client)(nil)
)

// inProcessOnly are the ledger's methods a client does not mirror, and why:
// they run the ledger itself or read its stream directly.
var inProcessOnly = map[string]string{
	"Close":               "lifecycle of the in-process ledger",
	"Flush":               "waits for the in-process ledger's background writes",
	"ServeAPI":            "serves the API the client calls",
	"ReadEntries":         "reads the stream (auditors use the audit HTTP API or export)",
	"Export":              "writes the stream to a file (the CLI's export uses the stream)",
	"StreamName":          "the in-process ledger's configuration",
	"BucketName":          "the in-process ledger's configuration",
	"Version":             "the in-process ledger's configuration",
	"ToolCollector":       "the in-process ledger's metrics",
	"ToolLabels":          "the in-process ledger's metrics (an executor on a client keeps its own)",
	"RecordRefusal":       "records what this process's own API subscribers refused (the views' inbox.list), as the API server does",
	"StartDeadlineKeeper": "runs the ledger's own deadline keeper (serve starts it beside the API)",
	"StartApprovalKeeper": "runs the ledger's own approval keeper (serve starts it beside the API)",
	"StartSweeper":        "runs the ledger's own report sweep (serve starts it beside the API)",
	"Sweep":               "one pass of the ledger's own report sweep, which serve runs",
	"ToolPauseOp":         "takes a request body as received over HTTP (serve's POST /projects/{p}/tools/{tool}/pause|resume); a client calls PauseTool and ResumeTool",
	"StorageFault":        "the in-process ledger's health (serve's /readyz and metrics)",
	"DeadlineGrace":       "the in-process deadline keeper's configuration (serve's overdue gauge)",
}

// TestClientHasTheLedgersOperations: every operation of the in-process
// ledger is on the client with the same signature, so code written against
// one runs on the other; a new ledger method must be mirrored or listed in
// inProcessOnly with its reason.
func TestClientHasTheLedgersOperations(t *testing.T) {
	lt := reflect.TypeFor[*ledger.Ledger]()
	ct := reflect.TypeFor[*client.Client]()
	for name := range inProcessOnly {
		if _, ok := lt.MethodByName(name); !ok {
			t.Errorf("inProcessOnly names %s, which ledger.Ledger does not have", name)
		}
	}
	var mirrored []string
	for m := range lt.Methods() {
		if _, ok := inProcessOnly[m.Name]; ok {
			continue
		}
		cm, ok := ct.MethodByName(m.Name)
		if !ok {
			t.Errorf("ledger.Ledger.%s has no client.Client.%s (mirror it, or say in inProcessOnly why not)", m.Name, m.Name)
			continue
		}
		// Compare without the receivers.
		if got, want := funcTypeString(cm.Type), funcTypeString(m.Type); got != want {
			t.Errorf("client.Client.%s is %s; ledger.Ledger.%s is %s", m.Name, got, m.Name, want)
		}
		mirrored = append(mirrored, m.Name)
	}
	for _, want := range []string{"Dispatch", "Report", "Resume", "PutCard", "GetCard", "GetCards", "GetCall", "Canceled",
		"Cancel", "Consume", "SetRoster", "GetRoster", "RegisterTool", "RegisterToolYAML", "GetTool", "ListTools",
		"EnsureToolConsumer", "RejectCommand", "ReadExecutionInputs", "Skip"} {
		require.Contains(t, mirrored, want)
	}
}

func funcTypeString(f reflect.Type) string {
	var in, out []string
	for i := 1; i < f.NumIn(); i++ {
		in = append(in, f.In(i).String())
	}
	for i := range f.NumOut() {
		out = append(out, f.Out(i).String())
	}
	return "func(" + strings.Join(in, ", ") + ") (" + strings.Join(out, ", ") + ")"
}

// TestClientAnswersAsTheLedger: the operations an executor needs, read over
// the API, give what the in-process ledger gives.
func TestClientAnswersAsTheLedger(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	nc := e.Srv.Connect(t)
	c := client.New(nc, client.WithActor("worker-tool"))

	_, err = e.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "p", AgentID: "a", WorkerTarget: "w"})
	require.NoError(t, err)
	done := ledgertest.Call{Project: "p", Channel: "main", Agent: "a", Turn: "t1", ID: "k1", Epoch: 1, Tool: "echo"}
	e.Complete(t, done, protocol.StatusSuccess, `{"text":"hi"}`)
	open := ledgertest.Call{Project: "p", Channel: "main", Agent: "a", Turn: "t2", ID: "k2", Epoch: 1, Tool: "echo"}
	_, err = e.L.Dispatch(ctx, open.Dispatch())
	require.NoError(t, err)
	_, err = e.L.Cancel(ctx, protocol.CancelRequest{ProjectID: "p", AgentID: "a", AgentTurnID: "t2", ToolCallID: "k2"})
	require.NoError(t, err)
	// Call records move on after the ledger answers (sequences recorded,
	// a reported call marked woken): the two reads compare them at rest.
	e.L.Flush()

	t.Run("inputs", func(t *testing.T) {
		for _, call := range []ledgertest.Call{done, open} {
			q := protocol.ExecutionQuery{Project: "p", Channel: "main", AgentTurnID: call.Turn, ToolCallID: call.ID,
				ToolCallCardID: call.CardID(), ToolName: "echo", Fresh: true}
			want := e.L.ReadExecutionInputs(ctx, q)
			got := c.ReadExecutionInputs(ctx, q)
			require.NoError(t, got.RecordErr)
			require.NoError(t, got.CancelErr)
			require.NoError(t, got.CardErr)
			require.Equal(t, want.Canceled, got.Canceled, "call %s", call.ID)
			require.Equal(t, call == open, got.Canceled)
			requireSameJSON(t, want.Record, got.Record)
			requireSameJSON(t, want.Card, got.Card)
			// echo is a built-in: no registered definition in either.
			require.ErrorIs(t, want.ToolErr, protocol.ErrNotFound)
			require.ErrorIs(t, got.ToolErr, protocol.ErrNotFound)
		}
	})
	t.Run("unknown card", func(t *testing.T) {
		_, err := c.GetCard(ctx, "p", "no-such-card")
		require.ErrorIs(t, err, protocol.ErrUnknownCard)
		_, err = e.L.GetCard(ctx, "p", "no-such-card")
		require.ErrorIs(t, err, protocol.ErrUnknownCard)
	})
	t.Run("resume", func(t *testing.T) {
		want, err := e.L.Resume(ctx, "p", "t1", "k1")
		require.NoError(t, err)
		got, err := c.Resume(ctx, "p", "t1", "k1")
		require.NoError(t, err)
		// Each resume of a reported call is a duplicate report of its own.
		require.True(t, got.Duplicate)
		require.Greater(t, got.DuplicateSeq, want.DuplicateSeq)
		want.DuplicateSeq, got.DuplicateSeq = 0, 0
		require.Equal(t, want, got)
		_, err = c.Resume(ctx, "p", "t2", "k2")
		require.ErrorIs(t, err, protocol.ErrNotReported)
	})
	t.Run("reject command", func(t *testing.T) {
		subject := "cg.v1.p.main.cmd.tool.echo"
		h := nats.Header{protocol.HeaderAgentID: {"a"}}
		data := []byte("not json \xff")
		le := &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid tool command",
			Violations: []protocol.Violation{{Field: "payload", Code: protocol.VInvalidJSON, Message: "is not JSON"}}}
		require.NoError(t, c.RejectCommand(ctx, subject, h, data, le))
		require.NotZero(t, le.Seq)
		m, err := e.JS.Stream(ctx, stream.DefaultName)
		require.NoError(t, err)
		msg, err := m.GetMsg(ctx, le.Seq)
		require.NoError(t, err)
		var re protocol.RejectionEntry
		require.NoError(t, json.Unmarshal(msg.Data, &re))
		require.Equal(t, protocol.OpCommand, re.Op)
		require.Equal(t, le.Violations, re.Violations)
		require.Equal(t, subject, re.Request.Subject)
		require.Equal(t, "echo", msg.Header.Get(protocol.HeaderActor), "recorded as asked by the command's tool")
	})
	t.Run("report as the target", func(t *testing.T) {
		// A call of tool_name "search" whose command targets "http": the
		// report's source function is "search", and the ledger wants the
		// target as actor, which WithActor gives.
		call := ledgertest.Call{Project: "p", Channel: "main", Agent: "a", Turn: "t3", ID: "k3", Epoch: 1, Tool: "search"}
		req := call.Dispatch()
		req.Subject = "cg.v1.p.main.cmd.tool.http"
		_, err := e.L.Dispatch(ctx, req)
		require.NoError(t, err)
		_, err = e.L.PutCard(ctx, call.ResultCard(protocol.StatusSuccess, `{}`))
		require.NoError(t, err)
		_, err = client.New(nc).Report(ctx, call.Report(protocol.StatusSuccess))
		require.ErrorIs(t, err, protocol.ErrForbidden, "as its source function, search")
		out, err := client.New(nc, client.WithActor("http")).Report(ctx, call.Report(protocol.StatusSuccess))
		require.NoError(t, err)
		require.False(t, out.Duplicate)
	})
	t.Run("refusals record the request", func(t *testing.T) {
		// Another tool resuming echo's call: refused before the stored
		// report is replayed, and recorded as this request.
		body := `{"project_id":"p","agent_turn_id":"t1","tool_call_id":"k1"}`
		le := rawRequest(t, nc, protocol.APISubject("p", "other", protocol.OpResume), body)
		require.Equal(t, protocol.CodeForbidden, le.Code)
		re := rejection(t, e, le.Seq)
		require.Equal(t, protocol.OpResume, re.Op)
		require.JSONEq(t, body, string(re.Request.Data))
		require.Empty(t, re.Request.Headers)

		// A command of another tool, and one of another project.
		for _, subject := range []string{"cg.v1.p.main.cmd.tool.search", "cg.v1.q.main.cmd.tool.echo"} {
			le := rawRequest(t, nc, protocol.APISubject("p", "echo", protocol.OpCommandReject),
				`{"subject":"`+subject+`","error":{"code":"bad_request","message":"m"}}`)
			require.Equal(t, protocol.CodeForbidden, le.Code, subject)
			require.Equal(t, "body.subject", le.Violations[0].Field)
			require.Equal(t, protocol.OpCommandReject, rejection(t, e, le.Seq).Op)
		}
	})
	t.Run("tools", func(t *testing.T) {
		// Built in Go: limits, retry and determinism left zero take
		// their defaults, as in a YAML definition that leaves them out.
		d := &protocol.ToolDefinition{ProjectID: "p", ToolName: "search", Parameters: json.RawMessage(`{"type":"object"}`),
			TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.search", AfterExecution: protocol.AfterSuspend}
		res, err := c.RegisterTool(ctx, d)
		require.NoError(t, err)
		require.False(t, res.Unchanged)
		require.Equal(t, int64(protocol.DefaultTimeoutMS), res.Definition.Limits.TimeoutMSDefault)
		require.Equal(t, protocol.DeterminismSideEffectful, res.Definition.Determinism)
		again, err := e.L.RegisterTool(ctx, d)
		require.NoError(t, err)
		require.True(t, again.Unchanged, "the client registered the same definition")
		tools, err := c.ListTools(ctx, "p")
		require.NoError(t, err)
		require.True(t, slices.ContainsFunc(tools, func(s protocol.StoredTool) bool { return s.Definition.ToolName == "search" }))
	})
}

func requireSameJSON(t *testing.T, want, got any) {
	t.Helper()
	w, err := json.Marshal(want)
	require.NoError(t, err)
	g, err := json.Marshal(got)
	require.NoError(t, err)
	require.JSONEq(t, string(w), string(g))
}

// rawRequest sends body to an API subject and returns the refusal.
func rawRequest(t *testing.T, nc *nats.Conn, subject, body string) *protocol.Error {
	t.Helper()
	m, err := nc.RequestWithContext(ledgertest.Ctx(t), subject, []byte(body))
	require.NoError(t, err)
	var r protocol.APIReply
	require.NoError(t, json.Unmarshal(m.Data, &r))
	require.False(t, r.OK, "%s answered %s", subject, r.Result)
	require.NotZero(t, r.Error.Seq, "the refusal is recorded")
	return r.Error
}

// rejection reads the rejection entry at seq.
func rejection(t *testing.T, e *ledgertest.Env, seq uint64) protocol.RejectionEntry {
	t.Helper()
	s, err := e.JS.Stream(ledgertest.Ctx(t), stream.DefaultName)
	require.NoError(t, err)
	msg, err := s.GetMsg(ledgertest.Ctx(t), seq)
	require.NoError(t, err)
	var re protocol.RejectionEntry
	require.NoError(t, json.Unmarshal(msg.Data, &re))
	return re
}

// TestARequestNobodyAnswersEnds: a request NATS delivers nowhere it is
// answered (as one refused on permissions) ends at the client's timeout when
// its context has no deadline, instead of waiting for ever.
func TestARequestNobodyAnswersEnds(t *testing.T) {
	e := ledgertest.New(t)
	nc := e.Srv.Connect(t)
	// A subscriber that swallows requests: there are responders, so NATS
	// does not answer "no responders" either.
	sub, err := e.NC.Subscribe(protocol.APISubject("p", "*", protocol.OpCallGet), func(*nats.Msg) {})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, e.NC.Flush())
	c := client.New(nc, client.WithTimeout(100*time.Millisecond))
	_, err = c.GetCall(context.Background(), "p", "t", "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestClientDispatchAsksForApproval: the dispatch body the client sends
// carries the request's approval, so a worker that asks for one gets its
// call held, as through the ledger itself.
func TestClientDispatchAsksForApproval(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	c := client.New(e.Srv.Connect(t), client.WithActor("a"))
	call := ledgertest.Call{Project: "p", Channel: "main", Agent: "a", Turn: "t1", ID: "held", Epoch: 1, Tool: "echo"}
	req := call.Dispatch()
	req.Approval = &protocol.DispatchApproval{Required: true}
	d, err := c.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, d.AwaitingApproval, "the call is held for approval")
	require.NotZero(t, d.ApprovalExpiresUnixMS)
	require.Zero(t, d.CommandSeq, "no command while held")
	rec, err := e.L.GetCall(ctx, "p", "t1", "held")
	require.NoError(t, err)
	require.Equal(t, protocol.StateAwaitingApproval, rec.State)
}

// TestClientDispatchCarriesChecks: the dispatch body the client sends
// carries the request's checks, so the ledger refuses (and records) a call
// to a tool the project does not have.
func TestClientDispatchCarriesChecks(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	c := client.New(e.Srv.Connect(t), client.WithActor("a"))
	call := ledgertest.Call{Project: "p", Channel: "main", Agent: "a", Turn: "t1", ID: "checked", Epoch: 1, Tool: "nobody"}
	req := call.Dispatch()
	req.Checks = &protocol.DispatchChecks{Registered: true}
	_, err = c.Dispatch(ctx, req)
	require.ErrorIs(t, err, protocol.ErrNotFound)
	pe, ok := protocol.AsError(err)
	require.True(t, ok)
	require.NotZero(t, pe.Seq, "the refusal is recorded")
	require.Equal(t, "card.content.tool_name", pe.Violations[0].Field)
	req.Checks = nil
	_, err = c.Dispatch(ctx, req)
	require.NoError(t, err, "without checks the same call is dispatched")
}

// TestClientPausesAndResumesATool: a client pauses a registered tool (a dispatch is
// then held, no command), and resumes it (the held call's command is
// published), through the ledger's API.
func TestClientPausesAndResumesATool(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	c := client.New(e.Srv.Connect(t), client.WithActor("a"))
	_, err = e.L.RegisterToolYAML(ctx, "p", []byte("tool_name: search\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.search\nafter_execution: suspend\n"))
	require.NoError(t, err)
	req := protocol.ToolPauseRequest{ProjectID: "p", ToolName: "search", Reason: "upstream maintenance"}
	p, err := c.PauseTool(ctx, "ops", req)
	require.NoError(t, err)
	require.True(t, p.Paused)
	require.NotZero(t, p.Seq)
	_, err = c.PauseTool(ctx, "ops", req)
	require.ErrorIs(t, err, protocol.ErrConflict, "pausing a paused tool")

	call := ledgertest.Call{Project: "p", Channel: "main", Agent: "a", Turn: "t1", ID: "held", Epoch: 1, Tool: "search"}
	d, err := c.Dispatch(ctx, call.Dispatch())
	require.NoError(t, err)
	require.Zero(t, d.CommandSeq, "no command while the tool is paused")

	r, err := c.ResumeTool(ctx, "ops", req)
	require.NoError(t, err)
	require.False(t, r.Paused)
	require.Equal(t, 1, r.Released)
	rec, err := e.L.GetCall(ctx, "p", "t1", "held")
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State)
	require.NotZero(t, rec.CommandSeq)
}
