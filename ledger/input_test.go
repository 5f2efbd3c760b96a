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

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// Tests for bad input an outside client can send: each is refused with a
// precise *protocol.Error, recorded as a rejection entry that is always valid
// JSON and UTF-8, and changes nothing already stored.

// inLastSeq is the stream's last sequence.
func (e *env) inLastSeq(t *testing.T) uint64 {
	t.Helper()
	js, err := e.nc.JetStream()
	require.NoError(t, err)
	info, err := js.StreamInfo(stream.DefaultName)
	require.NoError(t, err)
	return info.State.LastSeq
}

// inRejection reads the rejection entry at seq and checks that its data is
// valid UTF-8 and round-trips through encoding/json byte for byte.
func (e *env) inRejection(t *testing.T, seq uint64) protocol.RejectionEntry {
	t.Helper()
	require.NotZero(t, seq, "the refusal was not recorded")
	js, err := e.nc.JetStream()
	require.NoError(t, err)
	m, err := js.GetMsg(stream.DefaultName, seq)
	require.NoError(t, err)
	require.Equal(t, string(protocol.KindRejection), m.Header.Get(protocol.HeaderEntryKind))
	require.True(t, utf8.Valid(m.Data), "rejection entry is not UTF-8: %q", m.Data)
	require.True(t, json.Valid(m.Data), "rejection entry is not JSON: %q", m.Data)
	var re protocol.RejectionEntry
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
func (e *env) inRefused(t *testing.T, r rawReply, code string, want ...vtViol) protocol.RejectionEntry {
	t.Helper()
	require.False(t, r.OK, "request was accepted: %s", r.Result)
	require.NotNil(t, r.Error)
	require.Equal(t, code, r.Error.Code, "%+v", r.Error)
	got := make([]protocol.Violation, len(r.Error.Violations))
	for i, v := range r.Error.Violations {
		got[i] = protocol.Violation{Field: v.Field, Code: v.Code, Message: v.Message}
	}
	vtRequireViolations(t, got, want...)
	re := e.inRejection(t, r.Error.RejectionSeq)
	require.Equal(t, protocol.Code(code), re.Code)
	vtRequireViolations(t, re.Violations, want...)
	return re
}

// inDispatchBody is a valid dispatch API body for c.
func inDispatchBody(t *testing.T, c call) string {
	t.Helper()
	card, err := json.Marshal(c.card)
	require.NoError(t, err)
	return fmt.Sprintf(`{"subject":%q,"card":%s,"payload":{"tool_call_card_id":%q,"tool_name":"echo","after_execution":"suspend"}}`,
		protocol.ToolCommandSubject("v1", project, channel, "echo"), card, c.card.CardID)
}

// inReportHeader is a valid report header for c.
func inReportHeader(c call) nats.Header {
	h := c.identity().Header()
	h.Set(protocol.HeaderProjectID, project)
	h.Set(protocol.HeaderChannelID, channel)
	h.Set(protocol.HeaderSourceID, source)
	h.Set(protocol.HeaderSourceFunction, toolFn)
	return h
}

func TestReportAfterExecutionMustEqualTheCommand(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-ae", "call-ae", 3) // dispatched with after_execution suspend
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	// The result card overrides the effective value: that stays allowed.
	rc := c.resultCard(protocol.StatusSuccess)
	rc.Content = json.RawMessage(`{"status":"success","result":{"__cg_control":{"after_execution":"terminate"}}}`)
	_, err = e.l.PutCard(ctx, rc)
	require.NoError(t, err)

	terminate := c.reportReq(protocol.StatusSuccess, rc.CardID)
	terminate.Payload.AfterExecution = protocol.AfterTerminate
	before := e.inLastSeq(t)
	_, err = e.l.Report(ctx, terminate)
	require.ErrorIs(t, err, protocol.ErrMismatch)
	le, ok := protocol.AsError(err)
	require.True(t, ok)
	vtRequireViolations(t, le.Violations, vtViol{"payload.after_execution", protocol.VMismatch})
	require.Equal(t, before+1, le.Seq, "only the rejection entry is written")
	re := e.inRejection(t, le.Seq)
	require.Equal(t, protocol.OpReport, re.Op)
	require.Empty(t, e.subjectEntries(t, "cg.v1.*.*.ledger.report.>"))
	rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State, "the call is still open")

	// The command's own value is accepted; the card's override is effective.
	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.Equal(t, protocol.AfterSuspend, out.AfterExecution)
	require.Equal(t, protocol.AfterTerminate, out.EffectiveAfterExecution)

	// Duplicate and conflict still behave.
	dup, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, out.Seq, dup.Seq)
	_, err = e.l.Report(ctx, terminate)
	require.ErrorIs(t, err, protocol.ErrMismatch, "a changed after_execution is a mismatch before it is a conflict")
	other := c.resultCard(protocol.StatusFailed)
	_, err = e.l.PutCard(ctx, other)
	require.NoError(t, err)
	_, err = e.l.Report(ctx, c.reportReq(protocol.StatusFailed, other.CardID))
	require.ErrorIs(t, err, protocol.ErrConflict)
	require.Len(t, e.subjectEntries(t, "cg.v1.*.*.ledger.report.>"), 1)
}

func TestNonUTF8RequestsAreRefusedAndRecordedAsValidJSON(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	ctx := ctxT(t)
	c := newCall("turn-u", "call-u", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)

	bad := "\xff\xfe"
	projectHeader := nats.Header{protocol.HeaderProjectID: {project}}
	cases := []struct {
		name    string
		subject string
		h       nats.Header
		body    string
		want    []vtViol
	}{
		{"card.put body", protocol.APISubject(project, "x", protocol.OpCardPut), nil, `{"card_id":"x` + bad + `"}`, []vtViol{{"card", protocol.VInvalidUTF8}}},
		{"dispatch body", protocol.APISubject(project, agent, protocol.OpDispatch), c.identity().Header(), `{"subject":"` + bad + `"}`, []vtViol{{"body", protocol.VInvalidUTF8}}},
		{"report body", protocol.APISubject(project, "echo", protocol.OpReport), inReportHeader(c), `{"status":"success` + bad + `"}`, []vtViol{{"payload", protocol.VInvalidUTF8}}},
		{"roster.set body", protocol.APISubject(project, "x", protocol.OpRosterSet), nil, `{"project_id":"` + bad + `"}`, []vtViol{{"body", protocol.VInvalidUTF8}}},
		{"inbox.consume body", protocol.APISubject(project, "x", protocol.OpConsume), nil, `{"project_id":"` + bad + `"}`, []vtViol{{"body", protocol.VInvalidUTF8}}},
		{"cancel body", protocol.APISubject(project, "x", protocol.OpCancel), nil, `{"reason":"` + bad + `"}`, []vtViol{{"body", protocol.VInvalidUTF8}}},
		{"tool.register body", protocol.APISubject(project, "x", protocol.OpToolRegister), projectHeader, "tool_name: x" + bad, []vtViol{{"body", protocol.VInvalidUTF8}}},
		{"tool.register project header", protocol.APISubject(project, "x", protocol.OpToolRegister), nats.Header{protocol.HeaderProjectID: {"p" + bad}}, toolYAML,
			[]vtViol{{"header.CG-Project-Id", protocol.VInvalidUTF8}}},
		{"dispatch header value", protocol.APISubject(project, agent, protocol.OpDispatch), vtWith(newCall("turn-u2", "call-u2", 1).identity().Header(), protocol.HeaderTracestate, "k="+bad, "X-Other", bad),
			inDispatchBody(t, newCall("turn-u2", "call-u2", 1)), []vtViol{{"header.tracestate", protocol.VInvalidUTF8}, {"header.X-Other", protocol.VInvalidUTF8}}},
		{"report header value", protocol.APISubject(project, "echo", protocol.OpReport), vtWith(inReportHeader(c), protocol.HeaderSourceID, "tool"+bad),
			fmt.Sprintf(`{"status":"success","after_execution":"suspend","tool_result_card_id":%q}`, rc.CardID),
			[]vtViol{{"header.CG-Source-Id", protocol.VInvalidUTF8}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.inLastSeq(t)
			r := request(t, nc, tc.subject, tc.h, tc.body)
			re := e.inRefused(t, r, string(protocol.CodeBadRequest), tc.want...)
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
				if ok && tc.subject != protocol.APISubject(project, "x", protocol.OpToolRegister) {
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
	require.Equal(t, protocol.StateDispatched, rec.State)

	t.Run("command an executor refuses", func(t *testing.T) {
		subj := protocol.ToolCommandSubject("v1", project, channel, "echo")
		h := vtWith(c.identity().Header(), "X-Junk", bad)
		data := []byte(`{"tool_call_card_id":"` + bad + `"}`)
		_, err := protocol.ParseToolCommand(subj, h, data)
		vtRequireBadRequest(t, err, vtViol{"payload", protocol.VInvalidUTF8}, vtViol{"header.X-Junk", protocol.VInvalidUTF8})
		le, _ := protocol.AsError(err)
		require.NoError(t, e.l.RejectCommand(ctx, subj, h, data, le))
		re := e.inRejection(t, le.Seq)
		require.Equal(t, protocol.OpCommand, re.Op)
		raw, err := base64.StdEncoding.DecodeString(re.Request.DataBase64)
		require.NoError(t, err)
		require.Equal(t, data, raw)
	})
	t.Run("JSON strings with invalid UTF-8 inside a valid-looking body", func(t *testing.T) {
		// json.Valid accepts these bytes; the entry must not.
		card := c.resultCard(protocol.StatusSuccess)
		card.CardID = "rc-utf8"
		card.Content = json.RawMessage(`{"status":"success","result":"` + bad + `"}`)
		_, err := e.l.PutCard(ctx, card)
		require.ErrorIs(t, err, protocol.ErrBadRequest)
		le, _ := protocol.AsError(err)
		vtRequireViolations(t, le.Violations, vtViol{"card", protocol.VInvalidUTF8})
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
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)

	d := newCall("turn-h2", "call-h2", 7)
	dispatchCases := map[string]nats.Header{
		"two values":               vtWith(d.identity().Header(), protocol.HeaderTurnEpoch, "7"),
		"case variant, same value": vtWith(d.identity().Header(), "cg-turn-epoch", "7"),
		"case variant, other":      vtWith(d.identity().Header(), "CG-TURN-EPOCH", "8"),
	}
	dispatchCases["two values"][protocol.HeaderTurnEpoch] = []string{"7", "8"}
	for name, h := range dispatchCases {
		t.Run("dispatch "+name, func(t *testing.T) {
			before := e.inLastSeq(t)
			r := request(t, nc, protocol.APISubject(project, agent, protocol.OpDispatch), h, inDispatchBody(t, d))
			re := e.inRefused(t, r, string(protocol.CodeBadRequest), vtViol{"header.CG-Turn-Epoch", protocol.VDuplicate})
			require.Equal(t, before+1, r.Error.RejectionSeq)
			require.Equal(t, protocol.OpDispatch, re.Op)
		})
	}
	require.Empty(t, e.subjectEntries(t, "cg.v1."+project+".card."+d.card.CardID), "nothing was stored")
	_, err := e.l.GetCall(ctx, project, d.turn, d.id)
	require.ErrorIs(t, err, protocol.ErrUnknownCall)

	t.Run("report", func(t *testing.T) {
		h := inReportHeader(c)
		h["cg-source-id"] = []string{source}
		h["traceparent"] = []string{vtTrace, vtTrace}
		body := fmt.Sprintf(`{"status":"success","after_execution":"suspend","tool_result_card_id":%q}`, rc.CardID)
		r := request(t, nc, protocol.APISubject(project, "echo", protocol.OpReport), h, body)
		e.inRefused(t, r, string(protocol.CodeBadRequest),
			vtViol{"header.CG-Source-Id", protocol.VDuplicate}, vtViol{"header.traceparent", protocol.VDuplicate})
		rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, protocol.StateDispatched, rec.State)
	})
	t.Run("command", func(t *testing.T) {
		h := vtWith(c.identity().Header(), "Cg-Tool-Call-Id", c.id)
		_, err := protocol.ParseToolCommand(protocol.ToolCommandSubject("v1", project, channel, "echo"), h,
			[]byte(`{"tool_call_card_id":"x","after_execution":"suspend"}`))
		vtRequireBadRequest(t, err, vtViol{"header.CG-Tool-Call-Id", protocol.VDuplicate})
	})
}

func TestDuplicateJSONKeysAreRefused(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-d", "call-d", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)

	card := func(content string) []byte {
		return []byte(`{"card_id":"cd-1","project_id":"` + project + `","type":"tool.call","author_id":"a","agent_turn_id":"t","tool_call_id":"k",` +
			`"content":` + content + `}`)
	}
	refused := func(t *testing.T, err error, want ...vtViol) {
		t.Helper()
		vtRequireBadRequest(t, err, want...)
		le, _ := protocol.AsError(err)
		e.inRejection(t, le.Seq)
	}
	t.Run("card.put at every depth", func(t *testing.T) {
		before := e.inLastSeq(t)
		_, err := ledger.PutCardJSON(e.l, ctx, card(`{"tool_name":"x","arguments":{"q":1,"q":2,"list":[{"a":1},{"a":2,"a":3,"a":4}],"n":{"m":{"z":0,"z":0}}},"tool_name":"y"}`))
		refused(t, err,
			vtViol{"card.content.tool_name", protocol.VDuplicate},
			vtViol{"card.content.arguments.q", protocol.VDuplicate},
			vtViol{"card.content.arguments.list[1].a", protocol.VDuplicate},
			vtViol{"card.content.arguments.n.m.z", protocol.VDuplicate})
		require.Equal(t, before+1, e.inLastSeq(t))
		_, missing, err := e.l.GetCards(ctx, project, []string{"cd-1"})
		require.NoError(t, err)
		require.Equal(t, []string{"cd-1"}, missing)
	})
	t.Run("card top level", func(t *testing.T) {
		_, err := ledger.PutCardJSON(e.l, ctx, []byte(`{"card_id":"a","card_id":"b"}`))
		le, _ := protocol.AsError(err)
		require.NotNil(t, le)
		// The repeat does not hide the card's other problems.
		vtRequireViolations(t, le.Violations, vtViol{"card.card_id", protocol.VDuplicate},
			vtViol{"card.project_id", protocol.VRequired}, vtViol{"card.type", protocol.VRequired}, vtViol{"card.author_id", protocol.VRequired},
			vtViol{"card.agent_turn_id", protocol.VRequired}, vtViol{"card.tool_call_id", protocol.VRequired})
	})
	t.Run("dispatch", func(t *testing.T) {
		d := newCall("turn-d2", "call-d2", 1)
		body := strings.Replace(inDispatchBody(t, d), `"arguments":{"text":"hi"}`, `"arguments":{"text":"hi","text":"ho"}`, 1)
		body = strings.Replace(body, `"after_execution":"suspend"`, `"after_execution":"suspend","after_execution":"terminate"`, 1)
		require.Contains(t, body, `"text":"ho"`)
		_, err := ledger.DispatchMsg(e.l, ctx, d.identity().Header(), []byte(body))
		refused(t, err, vtViol{"card.content.arguments.text", protocol.VDuplicate}, vtViol{"payload.after_execution", protocol.VDuplicate})
		// A repeated top-level key is refused with every other problem of
		// the request, and the refusal keeps the body as received.
		asSent := `{"subject":"a","subject":"b","card":{},"payload":{}}`
		_, err = ledger.DispatchMsg(e.l, ctx, d.identity().Header(), []byte(asSent))
		refused(t, err, vtViol{"body.subject", protocol.VDuplicate}, vtViol{"subject", protocol.VInvalidSubject},
			vtViol{"payload.tool_call_card_id", protocol.VRequired}, vtViol{"payload.after_execution", protocol.VRequired},
			vtViol{"card.card_id", protocol.VRequired}, vtViol{"card.project_id", protocol.VRequired}, vtViol{"card.type", protocol.VRequired},
			vtViol{"card.author_id", protocol.VRequired}, vtViol{"card.agent_turn_id", protocol.VRequired}, vtViol{"card.tool_call_id", protocol.VRequired})
		le, _ := protocol.AsError(err)
		rej := e.inRejection(t, le.Seq)
		require.Equal(t, asSent, string(rej.Request.Data), "the refusal records the body as received")
		require.Empty(t, e.subjectEntries(t, "cg.v1."+project+".card."+d.card.CardID))
	})
	t.Run("report", func(t *testing.T) {
		body := fmt.Sprintf(`{"status":"success","status":"failed","after_execution":"suspend","tool_result_card_id":%q}`, rc.CardID)
		_, err := ledger.ReportMsg(e.l, ctx, inReportHeader(c), []byte(body))
		refused(t, err, vtViol{"payload.status", protocol.VDuplicate})
		rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, protocol.StateDispatched, rec.State)
	})
	t.Run("roster, consume, cancel, tool", func(t *testing.T) {
		_, err := ledger.SetRosterJSON(e.l, ctx, []byte(`{"project_id":"p","agent_id":"a","worker_target":"w1","worker_target":"w2"}`))
		refused(t, err, vtViol{"body.worker_target", protocol.VDuplicate})
		_, err = ledger.ConsumeJSON(e.l, ctx, []byte(`{"project_id":"p","project_id":"p","agent_id":"a","agent_turn_id":"t","tool_call_id":"k"}`))
		refused(t, err, vtViol{"body.project_id", protocol.VDuplicate})
		_, err = ledger.CancelJSON(e.l, ctx, []byte(`{"project_id":"p","agent_id":"a","agent_turn_id":"t","tool_call_id":"k","reason":"a","reason":"b"}`))
		refused(t, err, vtViol{"body.reason", protocol.VDuplicate})
		_, err = e.l.RegisterToolYAML(ctx, project, []byte(`{"tool_name":"a","tool_name":"b","parameters":{"type":"object","type":"object"}}`))
		refused(t, err, vtViol{"tool.tool_name", protocol.VDuplicate}, vtViol{"tool.parameters.type", protocol.VDuplicate})
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
	real := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	realJSON, err := json.Marshal(real)
	require.NoError(t, err)

	foreign := func(id, kind string, data []byte) {
		msg := &nats.Msg{Subject: protocol.CardSubject("v1", project, id), Data: data, Header: nats.Header{}}
		if kind != "" {
			msg.Header.Set(protocol.HeaderEntryKind, kind)
		}
		_, err := js.PublishMsg(msg)
		require.NoError(t, err)
	}
	wrongKindCard := c.resultCard(protocol.StatusSuccess)
	wrongKindCard.CardID = "fk-kind"
	wrongKindJSON, err := json.Marshal(wrongKindCard)
	require.NoError(t, err)
	foreign("fk-kind", string(protocol.KindCommand), wrongKindJSON)
	foreign("fk-nokind", "", wrongKindJSON)
	foreign("fk-garbage", string(protocol.KindCard), []byte("not json"))
	foreign("fk-empty", string(protocol.KindCard), []byte(`{}`))
	foreign("fk-otherid", string(protocol.KindCard), realJSON)
	// A foreign message after a real card does not hide it.
	foreign(real.CardID, string(protocol.KindCard), []byte(`{}`))

	ids := []string{"fk-kind", "fk-nokind", "fk-garbage", "fk-empty", "fk-otherid", real.CardID}
	cards, missing, err := e.l.GetCards(ctx, project, ids)
	require.NoError(t, err)
	require.Equal(t, ids[:5], missing)
	require.Len(t, cards, 1)
	require.Equal(t, real.CardID, cards[0].Card.CardID)

	r := request(t, nc, protocol.APISubject(project, "x", protocol.OpCardGet), nil, `{"project_id":"`+project+`","card_ids":["fk-kind","fk-garbage","fk-empty"]}`)
	require.True(t, r.OK, "%+v", r.Error)
	var got struct {
		Cards   []json.RawMessage `json:"cards"`
		Missing []string          `json:"missing"`
	}
	require.NoError(t, json.Unmarshal(r.Result, &got))
	require.Empty(t, got.Cards)
	require.Equal(t, []string{"fk-kind", "fk-garbage", "fk-empty"}, got.Missing)

	// A report naming such a card finds no card.
	_, err = e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, "fk-kind"))
	require.ErrorIs(t, err, protocol.ErrUnknownCard)
	// Putting a card under such an id is a conflict, not a duplicate.
	_, err = e.l.PutCard(ctx, wrongKindCard)
	require.ErrorIs(t, err, protocol.ErrConflict)
	// The real card is still served and reportable.
	_, err = e.l.PutCard(ctx, real)
	require.NoError(t, err, "the real card is a duplicate of itself")
	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, real.CardID))
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
	require.Less(t, int64(protocol.MaxRequestBytes+protocol.MaxHeaderBytes), nc.MaxPayload())

	big := func(n int) string { return strings.Repeat("é", n/2) } // valid multi-byte UTF-8
	c := newCall("turn-s", "call-s", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	cardBody := func(args string) string {
		return `{"card_id":"big","project_id":"` + project + `","type":"tool.call","author_id":"a","agent_turn_id":"t","tool_call_id":"k",` +
			`"content":{"tool_name":"x","arguments":{"blob":"` + args + `"}}}`
	}
	over := protocol.MaxRequestBytes + 1
	cases := []struct {
		name, subject string
		h             nats.Header
		body          string
		field         string
	}{
		{"card.put", protocol.APISubject(project, "x", protocol.OpCardPut), nil, cardBody(big(over)), "card"},
		{"dispatch", protocol.APISubject(project, agent, protocol.OpDispatch), c.identity().Header(), `{"subject":"` + big(over) + `"}`, "body"},
		{"report", protocol.APISubject(project, "echo", protocol.OpReport), inReportHeader(c), `{"status":"` + big(over) + `"}`, "payload"},
		{"roster.set", protocol.APISubject(project, "x", protocol.OpRosterSet), nil, `{"project_id":"` + big(over) + `"}`, "body"},
		{"inbox.consume", protocol.APISubject(project, "x", protocol.OpConsume), nil, `{"project_id":"` + big(over) + `"}`, "body"},
		{"cancel", protocol.APISubject(project, "x", protocol.OpCancel), nil, `{"reason":"` + big(over) + `"}`, "body"},
		{"tool.register", protocol.APISubject(project, "x", protocol.OpToolRegister), nats.Header{protocol.HeaderProjectID: {project}}, "description: " + big(over), "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Greater(t, len(tc.body), protocol.MaxRequestBytes)
			before := e.inLastSeq(t)
			r := request(t, nc, tc.subject, tc.h, tc.body)
			re := e.inRefused(t, r, string(protocol.CodeBadRequest), vtViol{tc.field, protocol.VTooLarge})
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
		body := cardBody(strings.Repeat("<", protocol.MaxCardBytes/6+1024))
		require.Less(t, len(body), protocol.MaxRequestBytes)
		r := request(t, nc, protocol.APISubject(project, "x", protocol.OpCardPut), nil, body)
		e.inRefused(t, r, string(protocol.CodeBadRequest), vtViol{"card", protocol.VTooLarge})
		_, missing, err := e.l.GetCards(ctx, project, []string{"big"})
		require.NoError(t, err)
		require.Equal(t, []string{"big"}, missing)
	})
	t.Run("a card just under the card limit is stored", func(t *testing.T) {
		body := cardBody(strings.Repeat("a", protocol.MaxCardBytes-1024))
		r := request(t, nc, protocol.APISubject(project, "x", protocol.OpCardPut), nil, body)
		require.True(t, r.OK, "%+v", r.Error)
		cards, _, err := e.l.GetCards(ctx, project, []string{"big"})
		require.NoError(t, err)
		require.Len(t, cards, 1)
	})
	t.Run("a dispatch with a card near the limit fits", func(t *testing.T) {
		d := newCall("turn-s2", "call-s2", 1)
		d.card.Content = json.RawMessage(`{"tool_name":"echo","arguments":{"blob":"` + strings.Repeat("a", protocol.MaxCardBytes-2048) + `"}}`)
		r := request(t, nc, protocol.APISubject(project, agent, protocol.OpDispatch), d.identity().Header(), inDispatchBody(t, d))
		require.True(t, r.OK, "%+v", r.Error)
	})
	t.Run("headers over the header limit", func(t *testing.T) {
		h := vtWith(inReportHeader(c), "X-Padding", strings.Repeat("p", protocol.MaxHeaderBytes))
		body := fmt.Sprintf(`{"status":"success","after_execution":"suspend","tool_result_card_id":%q}`, rc.CardID)
		r := request(t, nc, protocol.APISubject(project, "echo", protocol.OpReport), h, body)
		re := e.inRefused(t, r, string(protocol.CodeBadRequest), vtViol{"header", protocol.VTooLarge})
		require.True(t, re.Request.Truncated, "the headers kept are cut too")
		require.NotContains(t, re.Request.Headers, "X-Padding")
	})
	t.Run("the Go client gets the same refusal", func(t *testing.T) {
		cl := client.New(e.srv.Connect(t))
		card := c.resultCard(protocol.StatusSuccess)
		card.CardID = "big-client"
		card.Content = json.RawMessage(`{"status":"success","result":"` + strings.Repeat("x", over) + `"}`)
		_, err := cl.PutCard(ctx, card)
		require.ErrorIs(t, err, protocol.ErrBadRequest)
		var le *protocol.Error
		require.True(t, errors.As(err, &le))
		require.NotZero(t, le.Seq)
		assert.Equal(t, protocol.VTooLarge, le.Violations[0].Code)
	})
}
