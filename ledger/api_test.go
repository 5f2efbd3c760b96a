package ledger_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// rawReply is the API reply as a client in another language would decode it.
type rawReply struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code       string `json:"code"`
		Message    string `json:"message"`
		Violations []struct {
			Field   string `json:"field"`
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"violations"`
		RejectionSeq uint64 `json:"rejection_seq"`
	} `json:"error"`
}

func request(t *testing.T, nc *nats.Conn, subject string, h nats.Header, body string) rawReply {
	t.Helper()
	resp, err := nc.RequestMsg(&nats.Msg{Subject: subject, Header: h, Data: []byte(body)}, 10*time.Second)
	require.NoError(t, err)
	var r rawReply
	require.NoError(t, json.Unmarshal(resp.Data, &r), string(resp.Data))
	return r
}

func serveAPI(t *testing.T, e *env) {
	t.Helper()
	s, err := e.l.ServeAPI(ctxT(t), ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(s.Stop)
}

// TestAPIRawProtocolRoundTrip drives the whole flow with plain NATS requests,
// JSON bodies and CG-* headers only, as a client in another language would.
func TestAPIRawProtocolRoundTrip(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)

	r := request(t, nc, protocol.APISubject("p1", "a1", protocol.OpRosterSet), nil, `{"project_id":"p1","agent_id":"a1","worker_target":"worker_x"}`)
	require.True(t, r.OK, "%+v", r.Error)

	wake, err := nc.SubscribeSync("cg.v1.p1.c1.cmd.agent.worker_x.wakeup")
	require.NoError(t, err)
	cmds, err := nc.SubscribeSync("cg.v1.p1.c1.cmd.tool.>")
	require.NoError(t, err)

	h := nats.Header{}
	h.Set("CG-Agent-Id", "a1")
	h.Set("CG-Agent-Turn-Id", "t1")
	h.Set("CG-Turn-Epoch", "2")
	h.Set("CG-Tool-Call-Id", "k1")
	h.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	dispatch := `{"subject":"cg.v1.p1.c1.cmd.tool.search",
	  "card":{"card_id":"call-card-1","project_id":"p1","type":"tool.call","author_id":"a1","agent_turn_id":"t1","tool_call_id":"k1",
	          "content":{"tool_name":"search","arguments":{"q":"nats"}},
	          "metadata":{"trace_id":"tr1","parent_step_id":"ps1","step_id":"s1"}},
	  "payload":{"tool_call_card_id":"call-card-1","tool_name":"search","after_execution":"suspend"}}`
	r = request(t, nc, protocol.APISubject("p1", "a1", protocol.OpDispatch), h, dispatch)
	require.True(t, r.OK, "%+v", r.Error)
	var d protocol.DispatchResult
	require.NoError(t, json.Unmarshal(r.Result, &d))
	require.Equal(t, "cg.v1.p1.c1.cmd.tool.search", d.Subject)

	// The tool service sees the command with identity in headers and
	// business fields only in the payload.
	cmd, err := cmds.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "k1", cmd.Header.Get("CG-Tool-Call-Id"))
	require.Equal(t, "2", cmd.Header.Get("CG-Turn-Epoch"))
	// Plus the deadline the ledger fixed at dispatch (30s: the default of
	// a tool not registered).
	require.NotZero(t, d.DeadlineUnixMS)
	require.JSONEq(t, fmt.Sprintf(`{"tool_call_card_id":"call-card-1","tool_name":"search","after_execution":"suspend","deadline_unix_ms":%d}`, d.DeadlineUnixMS), string(cmd.Data))

	r = request(t, nc, protocol.APISubject("p1", "a1", protocol.OpCardGet), nil, `{"project_id":"p1","card_ids":["call-card-1","nope"]}`)
	require.True(t, r.OK, "%+v", r.Error)
	var got struct {
		Cards []struct {
			Card struct {
				Content struct {
					Arguments map[string]any `json:"arguments"`
				} `json:"content"`
				Metadata map[string]string `json:"metadata"`
			} `json:"card"`
			Seq uint64 `json:"seq"`
		} `json:"cards"`
		Missing []string `json:"missing"`
	}
	require.NoError(t, json.Unmarshal(r.Result, &got))
	require.Len(t, got.Cards, 1)
	require.Equal(t, "nats", got.Cards[0].Card.Content.Arguments["q"])
	require.Equal(t, []string{"nope"}, got.Missing)

	r = request(t, nc, protocol.APISubject("p1", "search", protocol.OpCardPut), nil, `{"card_id":"res-card-1","project_id":"p1","type":"tool.result","author_id":"tool.search","function_name":"search",
	  "agent_turn_id":"t1","tool_call_id":"k1","content":{"status":"success","result":{"hits":3,"__cg_control":{"after_execution":"terminate"}}},
	  "metadata":{"trace_id":"tr1","parent_step_id":"ps1","step_id":"s1"}}`)
	require.True(t, r.OK, "%+v", r.Error)

	rh := nats.Header{}
	for k, v := range h {
		rh[k] = v
	}
	rh.Set("CG-Project-Id", "p1")
	rh.Set("CG-Channel-Id", "c1")
	rh.Set("CG-Source-Id", "tool.search")
	rh.Set("CG-Source-Function", "search")
	r = request(t, nc, protocol.APISubject("p1", "search", protocol.OpReport), rh, `{"status":"success","after_execution":"suspend","tool_result_card_id":"res-card-1","step_id":"s1"}`)
	require.True(t, r.OK, "%+v", r.Error)
	var out protocol.ReportOutcome
	require.NoError(t, json.Unmarshal(r.Result, &out))
	require.False(t, out.Duplicate)
	require.Equal(t, "suspend", out.AfterExecution, "the report's own field is kept as sent")
	require.Equal(t, "terminate", out.EffectiveAfterExecution, "__cg_control override wins")

	w, err := wake.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "a1", w.Header.Get("CG-Agent-Id"))

	r = request(t, nc, protocol.APISubject("p1", "search", protocol.OpReport), rh, `{"status":"success","after_execution":"suspend","tool_result_card_id":"res-card-1","step_id":"s1"}`)
	require.True(t, r.OK)
	var dup protocol.ReportOutcome
	require.NoError(t, json.Unmarshal(r.Result, &dup))
	require.True(t, dup.Duplicate)
	require.Equal(t, out.Seq, dup.Seq)

	// The wakeup is the mark (issue 30): stored before the report's answer,
	// so call.get shows the call woken at once, with the wakeup's sequence
	// and the dispatch's, which the bucket's record does not hold.
	var rec protocol.CallRecord
	r = request(t, nc, protocol.APISubject("p1", "a1", protocol.OpCallGet), nil, `{"project_id":"p1","agent_turn_id":"t1","tool_call_id":"k1"}`)
	require.True(t, r.OK, "%+v", r.Error)
	require.NoError(t, json.Unmarshal(r.Result, &rec))
	require.Equal(t, protocol.StateWoken, rec.State)
	require.Equal(t, out.Seq, rec.Claim.Seq)
	require.Equal(t, out.Wakeup.Seq, rec.Claim.WakeupSeq)
	require.NotZero(t, rec.CardSeq)
	require.NotZero(t, rec.CommandSeq)

	r = request(t, nc, protocol.APISubject("p1", "a1", protocol.OpRosterGet), nil, `{"project_id":"p1","agent_id":"a1"}`)
	require.True(t, r.OK, "%+v", r.Error)
	r = request(t, nc, protocol.APISubject("p1", "a1", protocol.OpRosterGet), nil, `{"project_id":"p1","agent_id":"nobody"}`)
	require.False(t, r.OK)
	require.Equal(t, "not_found", r.Error.Code)
}

func TestAPIBadDispatchListsEveryViolationAndIsRecorded(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	h := nats.Header{}
	h.Set("CG-Agent-Id", "a1")
	h.Set("CG-Turn-Epoch", "-1")
	// Missing CG-Agent-Turn-Id and CG-Tool-Call-Id, bad epoch, inline args,
	// bad after_execution, empty tool_call_card_id, text content.
	body := `{"subject":"cg.v1.p1.c1.cmd.tool.search",
	  "card":{"card_id":"cc","project_id":"p1","type":"tool.call","author_id":"a1","agent_turn_id":"t1","tool_call_id":"k1","content":"just text"},
	  "payload":{"tool_call_card_id":"","args":{"q":1},"after_execution":"later"}}`
	r := request(t, nc, protocol.APISubject("p1", "a1", protocol.OpDispatch), h, body)
	require.False(t, r.OK)
	require.Equal(t, "bad_request", r.Error.Code)
	require.NotZero(t, r.Error.RejectionSeq)
	fields := map[string]string{}
	for _, v := range r.Error.Violations {
		fields[v.Field] = v.Code
	}
	require.Equal(t, map[string]string{
		"header.CG-Agent-Turn-Id":   "required",
		"header.CG-Turn-Epoch":      "invalid_value",
		"header.CG-Tool-Call-Id":    "required",
		"payload.args":              "forbidden",
		"payload.tool_call_card_id": "empty",
		"payload.after_execution":   "invalid_value",
		"card.content":              "invalid_type",
	}, fields)

	rej := e.subjectEntries(t, "cg.v1.p1.c1.ledger.rejection.bad_request")
	require.Len(t, rej, 1)
	var re protocol.RejectionEntry
	require.NoError(t, json.Unmarshal(rej[0].Data, &re))
	require.Equal(t, protocol.OpDispatch, re.Op)
	require.Len(t, re.Violations, len(fields))
	require.Equal(t, []string{"-1"}, re.Request.Headers["CG-Turn-Epoch"])
	// Nothing else was written: no card, no command.
	require.Empty(t, e.subjectEntries(t, "cg.v1.p1.card.>"))
	require.Empty(t, e.subjectEntries(t, "cg.v1.p1.c1.cmd.>"))
}

func TestAPIGarbageBodiesAreRejectedPrecisely(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	for _, tc := range []struct {
		subject, body, field, code string
	}{
		{protocol.APISubject("p", "a1", protocol.OpDispatch), `not json`, "body", "invalid_type"},
		{protocol.APISubject("p", "x", protocol.OpReport), `[1,2]`, "payload", "invalid_type"},
		{protocol.APISubject("p", "x", protocol.OpCardPut), ``, "card", "required"},
		{protocol.APISubject("p", "x", protocol.OpRosterSet), `{"project_id":"p","agent_id":"a.b","worker_target":"w"}`, "body.agent_id", "invalid_token"},
		{protocol.APISubject("p", "x", protocol.OpCardGet), `{"project_id":"p"}`, "body.card_ids", "required"},
	} {
		r := request(t, nc, tc.subject, nil, tc.body)
		require.False(t, r.OK, tc.subject)
		require.Equal(t, "bad_request", r.Error.Code, tc.subject)
		found := false
		for _, v := range r.Error.Violations {
			found = found || (v.Field == tc.field && v.Code == tc.code)
		}
		require.True(t, found, "%s: want %s/%s in %+v", tc.subject, tc.field, tc.code, r.Error.Violations)
	}
	// A body too malformed to name its project is recorded as the refusal
	// of the project its API subject names (NATS permissions scope it), so
	// the project's views list it: CG-Project-Id on the unrouted subject,
	// as for any refusal whose channel is unknown.
	rej := e.subjectEntries(t, "cg.v1._._.ledger.rejection.bad_request")
	require.Len(t, rej, 4, "every refused write (card.get is a read: no entry)")
	for _, m := range rej {
		require.Equal(t, "p", m.Header.Get(protocol.HeaderProjectID), string(m.Data))
	}
}

func TestClientMatchesLocalLedger(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	cl := client.New(e.srv.Connect(t))
	ctx := ctxT(t)
	c := newCall("turn-c", "call-c", 7)
	_, err := cl.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "wt"})
	require.NoError(t, err)
	d, err := cl.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	require.NotZero(t, d.CommandSeq)
	rc := c.resultCard(protocol.StatusSuccess)
	_, err = cl.PutCard(ctx, rc)
	require.NoError(t, err)
	cards, missing, err := cl.GetCards(ctx, project, []string{rc.CardID, c.card.CardID})
	require.NoError(t, err)
	require.Len(t, cards, 2)
	require.Empty(t, missing)
	stale := c
	stale.epoch = 6
	_, err = cl.Report(ctx, stale.reportReq(protocol.StatusSuccess, rc.CardID))
	require.ErrorIs(t, err, protocol.ErrStaleEpoch)
	out, err := cl.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.Equal(t, "wt", out.Wakeup.WorkerTarget)
	rec, err := cl.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, out.Seq, rec.Claim.Seq)
	_, err = cl.GetCall(ctx, project, c.turn, "nope")
	require.ErrorIs(t, err, protocol.ErrUnknownCall)
}

// TestAPIAnswersOnlyOnInboxes: without credentials everyone shares one
// account, so an answer on a reply subject under cg.> would be stored in the
// ledger. The ledger refuses to answer anywhere but an inbox, records the
// attempt, and sends nothing.
func TestAPIAnswersOnlyOnInboxes(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	evil := "cg.v1.p1.card.evil"
	for _, op := range []string{protocol.OpCardGet, protocol.OpRosterSet} {
		require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: protocol.APISubject("p1", "a1", op), Reply: evil,
			Data: []byte(`{"project_id":"p1","agent_id":"a1","worker_target":"w","card_ids":["x"]}`)}))
	}
	var ops []string
	require.Eventually(t, func() bool {
		ops = ops[:0]
		for _, m := range e.subjectEntries(t, "cg.v1.*.*.ledger.rejection.bad_request") {
			var re protocol.RejectionEntry
			require.NoError(t, json.Unmarshal(m.Data, &re))
			require.Equal(t, "reply", re.Violations[0].Field)
			ops = append(ops, re.Op)
		}
		return len(ops) == 2
	}, time.Minute, 20*time.Millisecond)
	require.ElementsMatch(t, []string{protocol.OpCardGet, protocol.OpRosterSet}, ops)
	require.Empty(t, e.subjectEntries(t, evil), "the ledger answered on a ledger subject")
	require.Empty(t, e.subjectEntries(t, "cg.v1.p1.roster.>"), "a refused request writes nothing else")
}
