package ledger_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
)

// Tests for bad input an outside client can send: each is refused with a
// precise *ledger.Error, recorded as a rejection entry that is always valid
// JSON and UTF-8, and changes nothing already stored.

// inLastSeq is the stream's last sequence.
func (e *env) inLastSeq(t *testing.T) uint64 {
	t.Helper()
	js, err := e.nc.JetStream()
	require.NoError(t, err)
	info, err := js.StreamInfo(ledger.DefaultStream)
	require.NoError(t, err)
	return info.State.LastSeq
}

// inRejection reads the rejection entry at seq and checks that its data is
// valid UTF-8 and round-trips through encoding/json byte for byte.
func (e *env) inRejection(t *testing.T, seq uint64) ledger.RejectionEntry {
	t.Helper()
	require.NotZero(t, seq, "the refusal was not recorded")
	js, err := e.nc.JetStream()
	require.NoError(t, err)
	m, err := js.GetMsg(ledger.DefaultStream, seq)
	require.NoError(t, err)
	require.Equal(t, string(ledger.KindRejection), m.Header.Get(ledger.HeaderEntryKind))
	require.True(t, utf8.Valid(m.Data), "rejection entry is not UTF-8: %q", m.Data)
	require.True(t, json.Valid(m.Data), "rejection entry is not JSON: %q", m.Data)
	var re ledger.RejectionEntry
	require.NoError(t, json.Unmarshal(m.Data, &re))
	again, err := json.Marshal(re)
	require.NoError(t, err)
	require.Equal(t, string(m.Data), string(again), "rejection entry does not round-trip")
	var generic any
	require.NoError(t, json.Unmarshal(m.Data, &generic))
	back, err := json.Marshal(generic)
	require.NoError(t, err)
	require.True(t, utf8.Valid(back))
	return re
}

// inRefused asserts a raw API reply is a refusal with code and exactly the
// violations want, recorded as a rejection entry; it returns that entry.
func (e *env) inRefused(t *testing.T, r rawReply, code string, want ...vtViol) ledger.RejectionEntry {
	t.Helper()
	require.False(t, r.OK, "request was accepted: %s", r.Result)
	require.NotNil(t, r.Error)
	require.Equal(t, code, r.Error.Code, "%+v", r.Error)
	got := make([]ledger.Violation, len(r.Error.Violations))
	for i, v := range r.Error.Violations {
		got[i] = ledger.Violation{Field: v.Field, Code: v.Code, Message: v.Message}
	}
	vtRequireViolations(t, got, want...)
	re := e.inRejection(t, r.Error.RejectionSeq)
	require.Equal(t, ledger.Code(code), re.Code)
	vtRequireViolations(t, re.Violations, want...)
	return re
}

// inDispatchBody is a valid dispatch API body for c.
func inDispatchBody(t *testing.T, c call) string {
	t.Helper()
	card, err := json.Marshal(c.card)
	require.NoError(t, err)
	return fmt.Sprintf(`{"subject":%q,"card":%s,"payload":{"tool_call_card_id":%q,"tool_name":"echo","after_execution":"suspend"}}`,
		ledger.ToolCommandSubject("v1", project, channel, "echo"), card, c.card.CardID)
}

// inReportHeader is a valid report header for c.
func inReportHeader(c call) nats.Header {
	h := c.identity().Header()
	h.Set(ledger.HeaderProjectID, project)
	h.Set(ledger.HeaderChannelID, channel)
	h.Set(ledger.HeaderSourceID, source)
	h.Set(ledger.HeaderSourceFunction, toolFn)
	return h
}

func TestReportAfterExecutionMustEqualTheCommand(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-ae", "call-ae", 3) // dispatched with after_execution suspend
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	// The result card overrides the effective value: that stays allowed.
	rc := c.resultCard(ledger.StatusSuccess)
	rc.Content = json.RawMessage(`{"status":"success","result":{"__cg_control":{"after_execution":"terminate"}}}`)
	_, err = e.l.PutCard(ctx, rc)
	require.NoError(t, err)

	terminate := c.reportReq(ledger.StatusSuccess, rc.CardID)
	terminate.Payload.AfterExecution = ledger.AfterTerminate
	before := e.inLastSeq(t)
	_, err = e.l.Report(ctx, terminate)
	require.ErrorIs(t, err, ledger.ErrMismatch)
	le, ok := ledger.AsError(err)
	require.True(t, ok)
	vtRequireViolations(t, le.Violations, vtViol{"payload.after_execution", ledger.VMismatch})
	require.Equal(t, before+1, le.Seq, "only the rejection entry is written")
	re := e.inRejection(t, le.Seq)
	require.Equal(t, ledger.OpReport, re.Op)
	require.Empty(t, e.subjectEntries(t, "cg.v1.*.*.ledger.report.>"))
	rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, ledger.StateDispatched, rec.State, "the call is still open")

	// The command's own value is accepted; the card's override is effective.
	out, err := e.l.Report(ctx, c.reportReq(ledger.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.Equal(t, ledger.AfterSuspend, out.AfterExecution)
	require.Equal(t, ledger.AfterTerminate, out.EffectiveAfterExecution)

	// Duplicate and conflict still behave.
	dup, err := e.l.Report(ctx, c.reportReq(ledger.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, out.Seq, dup.Seq)
	_, err = e.l.Report(ctx, terminate)
	require.ErrorIs(t, err, ledger.ErrMismatch, "a changed after_execution is a mismatch before it is a conflict")
	other := c.resultCard(ledger.StatusFailed)
	_, err = e.l.PutCard(ctx, other)
	require.NoError(t, err)
	_, err = e.l.Report(ctx, c.reportReq(ledger.StatusFailed, other.CardID))
	require.ErrorIs(t, err, ledger.ErrConflict)
	require.Len(t, e.subjectEntries(t, "cg.v1.*.*.ledger.report.>"), 1)
}

func TestNonUTF8RequestsAreRefusedAndRecordedAsValidJSON(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	ctx := ctxT(t)
	c := newCall("turn-u", "call-u", 1)
	rc := e.dispatchAndResult(t, c, ledger.StatusSuccess)

	bad := "\xff\xfe"
	projectHeader := nats.Header{ledger.HeaderProjectID: {project}}
	cases := []struct {
		name    string
		subject string
		h       nats.Header
		body    string
		want    []vtViol
	}{
		{"card.put body", ledger.APISubject(project, "x", ledger.OpCardPut), nil, `{"card_id":"x` + bad + `"}`, []vtViol{{"card", ledger.VInvalidUTF8}}},
		{"dispatch body", ledger.APISubject(project, agent, ledger.OpDispatch), c.identity().Header(), `{"subject":"` + bad + `"}`, []vtViol{{"body", ledger.VInvalidUTF8}}},
		{"report body", ledger.APISubject(project, "echo", ledger.OpReport), inReportHeader(c), `{"status":"success` + bad + `"}`, []vtViol{{"payload", ledger.VInvalidUTF8}}},
		{"roster.set body", ledger.APISubject(project, "x", ledger.OpRosterSet), nil, `{"project_id":"` + bad + `"}`, []vtViol{{"body", ledger.VInvalidUTF8}}},
		{"inbox.consume body", ledger.APISubject(project, "x", ledger.OpConsume), nil, `{"project_id":"` + bad + `"}`, []vtViol{{"body", ledger.VInvalidUTF8}}},
		{"cancel body", ledger.APISubject(project, "x", ledger.OpCancel), nil, `{"reason":"` + bad + `"}`, []vtViol{{"body", ledger.VInvalidUTF8}}},
		{"tool.register body", ledger.APISubject(project, "x", ledger.OpToolRegister), projectHeader, "tool_name: x" + bad, []vtViol{{"body", ledger.VInvalidUTF8}}},
		{"tool.register project header", ledger.APISubject(project, "x", ledger.OpToolRegister), nats.Header{ledger.HeaderProjectID: {"p" + bad}}, toolYAML,
			[]vtViol{{"header.CG-Project-Id", ledger.VInvalidUTF8}}},
		{"dispatch header value", ledger.APISubject(project, agent, ledger.OpDispatch), vtWith(newCall("turn-u2", "call-u2", 1).identity().Header(), ledger.HeaderTracestate, "k="+bad, "X-Other", bad),
			inDispatchBody(t, newCall("turn-u2", "call-u2", 1)), []vtViol{{"header.tracestate", ledger.VInvalidUTF8}, {"header.X-Other", ledger.VInvalidUTF8}}},
		{"report header value", ledger.APISubject(project, "echo", ledger.OpReport), vtWith(inReportHeader(c), ledger.HeaderSourceID, "tool"+bad),
			fmt.Sprintf(`{"status":"success","after_execution":"suspend","tool_result_card_id":%q}`, rc.CardID),
			[]vtViol{{"header.CG-Source-Id", ledger.VInvalidUTF8}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.inLastSeq(t)
			r := request(t, nc, tc.subject, tc.h, tc.body)
			re := e.inRefused(t, r, string(ledger.CodeBadRequest), tc.want...)
			require.Equal(t, before+1, r.Error.RejectionSeq, "only the rejection entry is written")
			if !utf8.ValidString(tc.body) {
				require.Empty(t, re.Request.Data)
				raw, err := base64.StdEncoding.DecodeString(re.Request.DataBase64)
				require.NoError(t, err)
				require.Equal(t, tc.body, string(raw), "data_base64 holds the body exactly")
			}
			for k, vs := range tc.h {
				ok := utf8.ValidString(k)
				for _, v := range vs {
					ok = ok && utf8.ValidString(v)
				}
				if ok && tc.subject != ledger.APISubject(project, "x", ledger.OpToolRegister) {
					require.Equal(t, vs, re.Request.Headers[k])
					continue
				}
				if !ok {
					key := base64.StdEncoding.EncodeToString([]byte(k))
					require.Len(t, re.Request.HeadersBase64[key], len(vs), "header %q", k)
					raw, err := base64.StdEncoding.DecodeString(re.Request.HeadersBase64[key][0])
					require.NoError(t, err)
					require.Equal(t, vs[0], string(raw))
				}
			}
		})
	}
	rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, ledger.StateDispatched, rec.State)

	t.Run("command an executor refuses", func(t *testing.T) {
		subj := ledger.ToolCommandSubject("v1", project, channel, "echo")
		h := vtWith(c.identity().Header(), "X-Junk", bad)
		data := []byte(`{"tool_call_card_id":"` + bad + `"}`)
		_, err := ledger.ParseToolCommand(subj, h, data)
		vtRequireBadRequest(t, err, vtViol{"payload", ledger.VInvalidUTF8}, vtViol{"header.X-Junk", ledger.VInvalidUTF8})
		le, _ := ledger.AsError(err)
		require.NoError(t, e.l.RejectCommand(ctx, subj, h, data, le))
		re := e.inRejection(t, le.Seq)
		require.Equal(t, ledger.OpCommand, re.Op)
		raw, err := base64.StdEncoding.DecodeString(re.Request.DataBase64)
		require.NoError(t, err)
		require.Equal(t, data, raw)
	})
	t.Run("JSON strings with invalid UTF-8 inside a valid-looking body", func(t *testing.T) {
		// json.Valid accepts these bytes; the entry must not.
		card := c.resultCard(ledger.StatusSuccess)
		card.CardID = "rc-utf8"
		card.Content = json.RawMessage(`{"status":"success","result":"` + bad + `"}`)
		_, err := e.l.PutCard(ctx, card)
		require.ErrorIs(t, err, ledger.ErrBadRequest)
		le, _ := ledger.AsError(err)
		vtRequireViolations(t, le.Violations, vtViol{"card", ledger.VInvalidUTF8})
		e.inRejection(t, le.Seq)
		require.Empty(t, e.subjectEntries(t, "cg.v1."+project+".card.rc-utf8"))
	})
}

const toolYAML = `tool_name: probe
parameters: {type: object}
target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.probe
after_execution: suspend
`

func TestRepeatedCGHeadersAreRefused(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	ctx := ctxT(t)
	c := newCall("turn-h", "call-h", 7)
	rc := e.dispatchAndResult(t, c, ledger.StatusSuccess)

	d := newCall("turn-h2", "call-h2", 7)
	dispatchCases := map[string]nats.Header{
		"two values":               vtWith(d.identity().Header(), ledger.HeaderTurnEpoch, "7"),
		"case variant, same value": vtWith(d.identity().Header(), "cg-turn-epoch", "7"),
		"case variant, other":      vtWith(d.identity().Header(), "CG-TURN-EPOCH", "8"),
	}
	dispatchCases["two values"][ledger.HeaderTurnEpoch] = []string{"7", "8"}
	for name, h := range dispatchCases {
		t.Run("dispatch "+name, func(t *testing.T) {
			before := e.inLastSeq(t)
			r := request(t, nc, ledger.APISubject(project, agent, ledger.OpDispatch), h, inDispatchBody(t, d))
			re := e.inRefused(t, r, string(ledger.CodeBadRequest), vtViol{"header.CG-Turn-Epoch", ledger.VDuplicate})
			require.Equal(t, before+1, r.Error.RejectionSeq)
			require.Equal(t, ledger.OpDispatch, re.Op)
		})
	}
	require.Empty(t, e.subjectEntries(t, "cg.v1."+project+".card."+d.card.CardID), "nothing was stored")
	_, err := e.l.GetCall(ctx, project, d.turn, d.id)
	require.ErrorIs(t, err, ledger.ErrUnknownCall)

	t.Run("report", func(t *testing.T) {
		h := inReportHeader(c)
		h["cg-source-id"] = []string{source}
		h["traceparent"] = []string{vtTrace, vtTrace}
		body := fmt.Sprintf(`{"status":"success","after_execution":"suspend","tool_result_card_id":%q}`, rc.CardID)
		r := request(t, nc, ledger.APISubject(project, "echo", ledger.OpReport), h, body)
		e.inRefused(t, r, string(ledger.CodeBadRequest),
			vtViol{"header.CG-Source-Id", ledger.VDuplicate}, vtViol{"header.traceparent", ledger.VDuplicate})
		rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, ledger.StateDispatched, rec.State)
	})
	t.Run("command", func(t *testing.T) {
		h := vtWith(c.identity().Header(), "Cg-Tool-Call-Id", c.id)
		_, err := ledger.ParseToolCommand(ledger.ToolCommandSubject("v1", project, channel, "echo"), h,
			[]byte(`{"tool_call_card_id":"x","after_execution":"suspend"}`))
		vtRequireBadRequest(t, err, vtViol{"header.CG-Tool-Call-Id", ledger.VDuplicate})
	})
}

func TestDuplicateJSONKeysAreRefused(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-d", "call-d", 1)
	rc := e.dispatchAndResult(t, c, ledger.StatusSuccess)

	card := func(content string) []byte {
		return []byte(`{"card_id":"cd-1","project_id":"` + project + `","type":"tool.call","author_id":"a","agent_turn_id":"t","tool_call_id":"k",` +
			`"content":` + content + `}`)
	}
	refused := func(t *testing.T, err error, want ...vtViol) {
		t.Helper()
		vtRequireBadRequest(t, err, want...)
		le, _ := ledger.AsError(err)
		e.inRejection(t, le.Seq)
	}
	t.Run("card.put at every depth", func(t *testing.T) {
		before := e.inLastSeq(t)
		_, err := e.l.PutCardJSON(ctx, card(`{"tool_name":"x","arguments":{"q":1,"q":2,"list":[{"a":1},{"a":2,"a":3,"a":4}],"n":{"m":{"z":0,"z":0}}},"tool_name":"y"}`))
		refused(t, err,
			vtViol{"card.content.tool_name", ledger.VDuplicate},
			vtViol{"card.content.arguments.q", ledger.VDuplicate},
			vtViol{"card.content.arguments.list[1].a", ledger.VDuplicate},
			vtViol{"card.content.arguments.n.m.z", ledger.VDuplicate})
		require.Equal(t, before+1, e.inLastSeq(t))
		_, missing, err := e.l.GetCards(ctx, project, []string{"cd-1"})
		require.NoError(t, err)
		require.Equal(t, []string{"cd-1"}, missing)
	})
	t.Run("card top level", func(t *testing.T) {
		_, err := e.l.PutCardJSON(ctx, []byte(`{"card_id":"a","card_id":"b"}`))
		le, _ := ledger.AsError(err)
		require.NotNil(t, le)
		// The repeat does not hide the card's other problems.
		vtRequireViolations(t, le.Violations, vtViol{"card.card_id", ledger.VDuplicate},
			vtViol{"card.project_id", ledger.VRequired}, vtViol{"card.type", ledger.VRequired}, vtViol{"card.author_id", ledger.VRequired},
			vtViol{"card.agent_turn_id", ledger.VRequired}, vtViol{"card.tool_call_id", ledger.VRequired})
	})
	t.Run("dispatch", func(t *testing.T) {
		d := newCall("turn-d2", "call-d2", 1)
		body := strings.Replace(inDispatchBody(t, d), `"arguments":{"text":"hi"}`, `"arguments":{"text":"hi","text":"ho"}`, 1)
		body = strings.Replace(body, `"after_execution":"suspend"`, `"after_execution":"suspend","after_execution":"terminate"`, 1)
		require.Contains(t, body, `"text":"ho"`)
		_, err := e.l.DispatchMsg(ctx, d.identity().Header(), []byte(body))
		refused(t, err, vtViol{"card.content.arguments.text", ledger.VDuplicate}, vtViol{"payload.after_execution", ledger.VDuplicate})
		// A repeated top-level key is refused with every other problem of
		// the request, and the refusal keeps the body as received.
		asSent := `{"subject":"a","subject":"b","card":{},"payload":{}}`
		_, err = e.l.DispatchMsg(ctx, d.identity().Header(), []byte(asSent))
		refused(t, err, vtViol{"body.subject", ledger.VDuplicate}, vtViol{"subject", ledger.VInvalidSubject},
			vtViol{"payload.tool_call_card_id", ledger.VRequired}, vtViol{"payload.after_execution", ledger.VRequired},
			vtViol{"card.card_id", ledger.VRequired}, vtViol{"card.project_id", ledger.VRequired}, vtViol{"card.type", ledger.VRequired},
			vtViol{"card.author_id", ledger.VRequired}, vtViol{"card.agent_turn_id", ledger.VRequired}, vtViol{"card.tool_call_id", ledger.VRequired})
		le, _ := ledger.AsError(err)
		rej := e.inRejection(t, le.Seq)
		require.Equal(t, asSent, string(rej.Request.Data), "the refusal records the body as received")
		require.Empty(t, e.subjectEntries(t, "cg.v1."+project+".card."+d.card.CardID))
	})
	t.Run("report", func(t *testing.T) {
		body := fmt.Sprintf(`{"status":"success","status":"failed","after_execution":"suspend","tool_result_card_id":%q}`, rc.CardID)
		_, err := e.l.ReportMsg(ctx, inReportHeader(c), []byte(body))
		refused(t, err, vtViol{"payload.status", ledger.VDuplicate})
		rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, ledger.StateDispatched, rec.State)
	})
	t.Run("roster, consume, cancel, tool", func(t *testing.T) {
		_, err := e.l.SetRosterJSON(ctx, []byte(`{"project_id":"p","agent_id":"a","worker_target":"w1","worker_target":"w2"}`))
		refused(t, err, vtViol{"body.worker_target", ledger.VDuplicate})
		_, err = e.l.ConsumeJSON(ctx, []byte(`{"project_id":"p","project_id":"p","agent_id":"a","agent_turn_id":"t","tool_call_id":"k"}`))
		refused(t, err, vtViol{"body.project_id", ledger.VDuplicate})
		_, err = e.l.CancelJSON(ctx, []byte(`{"project_id":"p","agent_id":"a","agent_turn_id":"t","tool_call_id":"k","reason":"a","reason":"b"}`))
		refused(t, err, vtViol{"body.reason", ledger.VDuplicate})
		_, err = e.l.RegisterToolYAML(ctx, project, []byte(`{"tool_name":"a","tool_name":"b","parameters":{"type":"object","type":"object"}}`))
		refused(t, err, vtViol{"tool.tool_name", ledger.VDuplicate}, vtViol{"tool.parameters.type", ledger.VDuplicate})
	})
}

func TestCardGetListsNonCardMessagesAsMissing(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	ctx := ctxT(t)
	js, err := nc.JetStream()
	require.NoError(t, err)
	c := newCall("turn-g", "call-g", 1)
	real := e.dispatchAndResult(t, c, ledger.StatusSuccess)
	realJSON, err := json.Marshal(real)
	require.NoError(t, err)

	foreign := func(id, kind string, data []byte) {
		msg := &nats.Msg{Subject: ledger.CardSubject("v1", project, id), Data: data, Header: nats.Header{}}
		if kind != "" {
			msg.Header.Set(ledger.HeaderEntryKind, kind)
		}
		_, err := js.PublishMsg(msg)
		require.NoError(t, err)
	}
	wrongKindCard := c.resultCard(ledger.StatusSuccess)
	wrongKindCard.CardID = "fk-kind"
	wrongKindJSON, err := json.Marshal(wrongKindCard)
	require.NoError(t, err)
	foreign("fk-kind", string(ledger.KindCommand), wrongKindJSON)
	foreign("fk-nokind", "", wrongKindJSON)
	foreign("fk-garbage", string(ledger.KindCard), []byte("not json"))
	foreign("fk-empty", string(ledger.KindCard), []byte(`{}`))
	foreign("fk-otherid", string(ledger.KindCard), realJSON)
	// A foreign message after a real card does not hide it.
	foreign(real.CardID, string(ledger.KindCard), []byte(`{}`))

	ids := []string{"fk-kind", "fk-nokind", "fk-garbage", "fk-empty", "fk-otherid", real.CardID}
	cards, missing, err := e.l.GetCards(ctx, project, ids)
	require.NoError(t, err)
	require.Equal(t, ids[:5], missing)
	require.Len(t, cards, 1)
	require.Equal(t, real.CardID, cards[0].Card.CardID)

	r := request(t, nc, ledger.APISubject(project, "x", ledger.OpCardGet), nil, `{"project_id":"`+project+`","card_ids":["fk-kind","fk-garbage","fk-empty"]}`)
	require.True(t, r.OK, "%+v", r.Error)
	var got struct {
		Cards   []json.RawMessage `json:"cards"`
		Missing []string          `json:"missing"`
	}
	require.NoError(t, json.Unmarshal(r.Result, &got))
	require.Empty(t, got.Cards)
	require.Equal(t, []string{"fk-kind", "fk-garbage", "fk-empty"}, got.Missing)

	// A report naming such a card finds no card.
	_, err = e.l.Report(ctx, c.reportReq(ledger.StatusSuccess, "fk-kind"))
	require.ErrorIs(t, err, ledger.ErrUnknownCard)
	// Putting a card under such an id is a conflict, not a duplicate.
	_, err = e.l.PutCard(ctx, wrongKindCard)
	require.ErrorIs(t, err, ledger.ErrConflict)
	// The real card is still served and reportable.
	_, err = e.l.PutCard(ctx, real)
	require.NoError(t, err, "the real card is a duplicate of itself")
	out, err := e.l.Report(ctx, c.reportReq(ledger.StatusSuccess, real.CardID))
	require.NoError(t, err)
	require.False(t, out.Duplicate)
}

func TestOversizedRequestsAreRefusedAndRecorded(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	ctx := ctxT(t)
	// Every documented limit fits under NATS's max_payload, so oversized
	// requests reach the ledger rather than fail in the client.
	require.Less(t, int64(ledger.MaxRequestBytes+ledger.MaxHeaderBytes), nc.MaxPayload())

	big := func(n int) string { return strings.Repeat("é", n/2) } // valid multi-byte UTF-8
	c := newCall("turn-s", "call-s", 1)
	rc := e.dispatchAndResult(t, c, ledger.StatusSuccess)
	cardBody := func(args string) string {
		return `{"card_id":"big","project_id":"` + project + `","type":"tool.call","author_id":"a","agent_turn_id":"t","tool_call_id":"k",` +
			`"content":{"tool_name":"x","arguments":{"blob":"` + args + `"}}}`
	}
	over := ledger.MaxRequestBytes + 1
	cases := []struct {
		name, subject string
		h             nats.Header
		body          string
		field         string
	}{
		{"card.put", ledger.APISubject(project, "x", ledger.OpCardPut), nil, cardBody(big(over)), "card"},
		{"dispatch", ledger.APISubject(project, agent, ledger.OpDispatch), c.identity().Header(), `{"subject":"` + big(over) + `"}`, "body"},
		{"report", ledger.APISubject(project, "echo", ledger.OpReport), inReportHeader(c), `{"status":"` + big(over) + `"}`, "payload"},
		{"roster.set", ledger.APISubject(project, "x", ledger.OpRosterSet), nil, `{"project_id":"` + big(over) + `"}`, "body"},
		{"inbox.consume", ledger.APISubject(project, "x", ledger.OpConsume), nil, `{"project_id":"` + big(over) + `"}`, "body"},
		{"cancel", ledger.APISubject(project, "x", ledger.OpCancel), nil, `{"reason":"` + big(over) + `"}`, "body"},
		{"tool.register", ledger.APISubject(project, "x", ledger.OpToolRegister), nats.Header{ledger.HeaderProjectID: {project}}, "description: " + big(over), "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Greater(t, len(tc.body), ledger.MaxRequestBytes)
			before := e.inLastSeq(t)
			r := request(t, nc, tc.subject, tc.h, tc.body)
			re := e.inRefused(t, r, string(ledger.CodeBadRequest), vtViol{tc.field, ledger.VTooLarge})
			require.Equal(t, before+1, r.Error.RejectionSeq)
			require.True(t, re.Request.Truncated)
			var kept string
			require.NoError(t, json.Unmarshal(re.Request.Data, &kept), "a cut body is kept as a JSON string")
			require.LessOrEqual(t, len(kept), 16<<10)
			require.True(t, strings.HasPrefix(tc.body, kept), "the body is cut on a character boundary")
		})
	}

	t.Run("card over the card limit, request under the request limit", func(t *testing.T) {
		// '<' is stored as \u003c: six bytes each.
		body := cardBody(strings.Repeat("<", ledger.MaxCardBytes/6+1024))
		require.Less(t, len(body), ledger.MaxRequestBytes)
		r := request(t, nc, ledger.APISubject(project, "x", ledger.OpCardPut), nil, body)
		e.inRefused(t, r, string(ledger.CodeBadRequest), vtViol{"card", ledger.VTooLarge})
		_, missing, err := e.l.GetCards(ctx, project, []string{"big"})
		require.NoError(t, err)
		require.Equal(t, []string{"big"}, missing)
	})
	t.Run("a card just under the card limit is stored", func(t *testing.T) {
		body := cardBody(strings.Repeat("a", ledger.MaxCardBytes-1024))
		r := request(t, nc, ledger.APISubject(project, "x", ledger.OpCardPut), nil, body)
		require.True(t, r.OK, "%+v", r.Error)
		cards, _, err := e.l.GetCards(ctx, project, []string{"big"})
		require.NoError(t, err)
		require.Len(t, cards, 1)
	})
	t.Run("a dispatch with a card near the limit fits", func(t *testing.T) {
		d := newCall("turn-s2", "call-s2", 1)
		d.card.Content = json.RawMessage(`{"tool_name":"echo","arguments":{"blob":"` + strings.Repeat("a", ledger.MaxCardBytes-2048) + `"}}`)
		r := request(t, nc, ledger.APISubject(project, agent, ledger.OpDispatch), d.identity().Header(), inDispatchBody(t, d))
		require.True(t, r.OK, "%+v", r.Error)
	})
	t.Run("headers over the header limit", func(t *testing.T) {
		h := vtWith(inReportHeader(c), "X-Padding", strings.Repeat("p", ledger.MaxHeaderBytes))
		body := fmt.Sprintf(`{"status":"success","after_execution":"suspend","tool_result_card_id":%q}`, rc.CardID)
		r := request(t, nc, ledger.APISubject(project, "echo", ledger.OpReport), h, body)
		re := e.inRefused(t, r, string(ledger.CodeBadRequest), vtViol{"header", ledger.VTooLarge})
		require.True(t, re.Request.Truncated, "the headers kept are cut too")
		require.NotContains(t, re.Request.Headers, "X-Padding")
	})
	t.Run("the Go client gets the same refusal", func(t *testing.T) {
		cl := ledger.NewClient(e.srv.Connect(t))
		card := c.resultCard(ledger.StatusSuccess)
		card.CardID = "big-client"
		card.Content = json.RawMessage(`{"status":"success","result":"` + strings.Repeat("x", over) + `"}`)
		_, err := cl.PutCard(ctx, card)
		require.ErrorIs(t, err, ledger.ErrBadRequest)
		var le *ledger.Error
		require.True(t, errors.As(err, &le))
		require.NotZero(t, le.Seq)
		assert.Equal(t, ledger.VTooLarge, le.Violations[0].Code)
	})
}
