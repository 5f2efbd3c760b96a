package ledger

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestReportFromRequestAgreesWithTheParser: a typed report the core takes as
// it is (reportFromRequest) is one the API's parser accepts, over the bytes
// it would have been sent as, reading back the same input; any other is
// left to the parser.
func TestReportFromRequestAgreesWithTheParser(t *testing.T) {
	base := protocol.ReportRequest{
		ProjectID: "p1", ChannelID: "c1", SourceID: "tool.echo", SourceFunction: "echo",
		Identity: protocol.Identity{AgentID: "a1", AgentTurnID: "t1", TurnEpoch: 0, ToolCallID: "k1"},
		Payload:  protocol.ReportPayload{Status: protocol.StatusSuccess, AfterExecution: protocol.AfterSuspend, ToolResultCardID: "rc1"},
	}
	edit := func(f func(r *protocol.ReportRequest)) protocol.ReportRequest {
		r := base
		f(&r)
		return r
	}
	cases := map[string]protocol.ReportRequest{
		"plain":        base,
		"epoch":        edit(func(r *protocol.ReportRequest) { r.Identity.TurnEpoch = 18446744073709551615 }),
		"header step":  edit(func(r *protocol.ReportRequest) { r.Identity.StepID = "s1" }),
		"payload step": edit(func(r *protocol.ReportRequest) { r.Payload.StepID = "s1" }),
		"both steps":   edit(func(r *protocol.ReportRequest) { r.Identity.StepID, r.Payload.StepID = "s1", "s1" }),
		"steps differ": edit(func(r *protocol.ReportRequest) { r.Identity.StepID, r.Payload.StepID = "s1", "s2" }),
		"trace": edit(func(r *protocol.ReportRequest) {
			r.Identity.Traceparent, r.Identity.Tracestate = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v"
		}),
		"bad trace":       edit(func(r *protocol.ReportRequest) { r.Identity.Traceparent = "00-0-0-0" }),
		"long tracestate": edit(func(r *protocol.ReportRequest) { r.Identity.Tracestate = strings.Repeat("k", 513) }),
		"context box":     edit(func(r *protocol.ReportRequest) { r.Identity.ContextBoxID = "box" }),
		"unicode source":  edit(func(r *protocol.ReportRequest) { r.SourceFunction = "écho" }),
		"bad utf8 source": edit(func(r *protocol.ReportRequest) { r.SourceID = "a\xffb" }),
		"space source":    edit(func(r *protocol.ReportRequest) { r.SourceID = "a b" }),
		"no project":      edit(func(r *protocol.ReportRequest) { r.ProjectID = "" }),
		"dotted channel":  edit(func(r *protocol.ReportRequest) { r.ChannelID = "c.1" }),
		"no call":         edit(func(r *protocol.ReportRequest) { r.Identity.ToolCallID = "" }),
		"bad status":      edit(func(r *protocol.ReportRequest) { r.Payload.Status = "done" }),
		"bad after":       edit(func(r *protocol.ReportRequest) { r.Payload.AfterExecution = "" }),
		"reconciled":      edit(func(r *protocol.ReportRequest) { r.Payload.AttemptOutcome = protocol.AttemptReconciled }),
		"unknown, failed": edit(func(r *protocol.ReportRequest) {
			r.Payload.AttemptOutcome, r.Payload.Status = protocol.AttemptOutcomeUnknown, protocol.StatusFailed
		}),
		"unknown, success": edit(func(r *protocol.ReportRequest) { r.Payload.AttemptOutcome = protocol.AttemptOutcomeUnknown }),
		"bad outcome":      edit(func(r *protocol.ReportRequest) { r.Payload.AttemptOutcome = "maybe" }),
		"long id": edit(func(r *protocol.ReportRequest) {
			r.Identity.AgentTurnID = strings.Repeat("t", protocol.MaxIdentifierLen)
		}),
		"too long id": edit(func(r *protocol.ReportRequest) {
			r.Identity.AgentTurnID = strings.Repeat("t", protocol.MaxIdentifierLen+1)
		}),
		"unrouted project":  edit(func(r *protocol.ReportRequest) { r.ProjectID = protocol.Unrouted }),
		"no result card id": edit(func(r *protocol.ReportRequest) { r.Payload.ToolResultCardID = "" }),
	}
	certain := 0
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			in, ok := reportFromRequest(req)
			h, data := reportWire(req)
			parsed, vs := protocol.ParseReport(h, data)
			if !ok {
				return
			}
			certain++
			require.Empty(t, vs, "taken as certainly valid, but the parser refuses it")
			want := reportInput{project: parsed.ProjectID, channel: parsed.ChannelID, id: parsed.Identity, sourceID: parsed.SourceID,
				sourceFunction: parsed.SourceFunction, payload: parsed.Payload, stepID: in.stepID}
			require.Equal(t, want, *in)
			require.Equal(t, parsed.Identity.StepID+parsed.Payload.StepID == "", in.stepID == "")
		})
	}
	require.Greater(t, certain, 8)
}

// TestDispatchCertaintyAgreesWithTheParsers: an identity and a command
// payload the dispatch core takes as they are (identityCertain,
// payloadCertain) are ones the API's parsers accept, over the bytes they
// would have been sent as, reading back the same values.
func TestDispatchCertaintyAgreesWithTheParsers(t *testing.T) {
	id := protocol.Identity{AgentID: "a1", AgentTurnID: "t1", TurnEpoch: 7, ToolCallID: "k1"}
	ids := []protocol.Identity{id,
		{AgentID: "a1", AgentTurnID: "t1", ToolCallID: "k1", StepID: "s1", ContextBoxID: "b1", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "k=v,x=y"},
		{AgentID: "a1", AgentTurnID: "t1", ToolCallID: ""},
		{AgentID: "a 1", AgentTurnID: "t1", ToolCallID: "k1"},
		{AgentID: "a1", AgentTurnID: "t1", ToolCallID: "k1", Tracestate: "\x01"},
		{AgentID: "a1", AgentTurnID: "t1", ToolCallID: "k1", Traceparent: "nope"},
	}
	certain := 0
	for _, x := range ids {
		if !identityCertain(x) {
			continue
		}
		certain++
		got, vs := protocol.ParseIdentity(x.Header(), protocol.IdentityRules{RequireToolCallID: true})
		require.Empty(t, vs, "%+v", x)
		require.Equal(t, x, got)
	}
	require.Equal(t, 2, certain)

	sub, err := protocol.ParseSubject(protocol.ToolCommandSubject("v1", "p1", "c1", "echo"))
	require.NoError(t, err)
	payloads := []protocol.ToolCommandPayload{
		{ToolCallCardID: "cc1", AfterExecution: protocol.AfterSuspend},
		{ToolCallCardID: "cc1", ToolName: "écho<&>", AfterExecution: protocol.AfterTerminate, TimeoutMS: 1},
		{ToolCallCardID: "cc1", ToolName: "echo", AfterExecution: protocol.AfterSuspend, TimeoutMS: 24 * 3600 * 1000},
		{ToolCallCardID: "cc1", AfterExecution: protocol.AfterSuspend, TimeoutMS: 24*3600*1000 + 1},
		{ToolCallCardID: "cc1", AfterExecution: protocol.AfterSuspend, TimeoutMS: -1},
		{ToolCallCardID: "cc1", AfterExecution: protocol.AfterSuspend, DeadlineUnixMS: 5},
		{ToolCallCardID: "cc1", AfterExecution: "later"},
		{ToolCallCardID: "", AfterExecution: protocol.AfterSuspend},
		{ToolCallCardID: "cc1", ToolName: "a b", AfterExecution: protocol.AfterSuspend},
	}
	certain = 0
	for _, p := range payloads {
		if !payloadCertain(p) {
			continue
		}
		certain++
		b, err := json.Marshal(p)
		require.NoError(t, err)
		var vs protocol.Violations
		got := protocol.DecodeCommandPayload(b, sub, id, nil, &vs)
		require.Empty(t, vs, "%+v", p)
		require.Equal(t, p, got)
	}
	require.Equal(t, 3, certain)
}

// TestResultFromRequestAgreesWithTheParser: a typed report.result the core
// takes as it is (resultFromRequest) is one the API's parser accepts, over
// the bytes it would have been sent as, reading back the same report, the
// same card and the same stored bytes; any other is left to the parser.
func TestResultFromRequestAgreesWithTheParser(t *testing.T) {
	card := protocol.Card{
		CardID: "rc1", ProjectID: "p1", Type: protocol.CardToolResult, AuthorID: "tool.echo", FunctionName: "echo",
		AgentTurnID: "t1", ToolCallID: "k1", Content: json.RawMessage(`{"status":"success","result":{"text":"hi"}}`),
		Metadata: protocol.CardMetadata{TraceID: "tr", ParentStepID: "ps", StepID: "s1"},
	}
	req := protocol.ReportRequest{
		ProjectID: "p1", ChannelID: "c1", SourceID: "tool.echo", SourceFunction: "echo",
		Identity: protocol.Identity{AgentID: "a1", AgentTurnID: "t1", TurnEpoch: 3, ToolCallID: "k1"},
		Payload:  protocol.ReportPayload{Status: protocol.StatusSuccess, AfterExecution: protocol.AfterSuspend},
	}
	type pair struct {
		card protocol.Card
		req  protocol.ReportRequest
	}
	edit := func(f func(c *protocol.Card, r *protocol.ReportRequest)) pair {
		c, r := card, req
		f(&c, &r)
		return pair{c, r}
	}
	content := func(s string) pair {
		return edit(func(c *protocol.Card, _ *protocol.ReportRequest) { c.Content = json.RawMessage(s) })
	}
	deep := strings.Repeat("[", protocol.MaxJSONDepth) + strings.Repeat("]", protocol.MaxJSONDepth)
	cases := map[string]pair{
		"plain":           {card, req},
		"card id given":   edit(func(_ *protocol.Card, r *protocol.ReportRequest) { r.Payload.ToolResultCardID = "rc1" }),
		"other card id":   edit(func(_ *protocol.Card, r *protocol.ReportRequest) { r.Payload.ToolResultCardID = "rc2" }),
		"status mismatch": edit(func(_ *protocol.Card, r *protocol.ReportRequest) { r.Payload.Status = protocol.StatusPartial }),
		"partial": edit(func(c *protocol.Card, r *protocol.ReportRequest) {
			r.Payload.Status = protocol.StatusPartial
			c.Content = json.RawMessage(`{"status":"partial","result":[1,2]}`)
		}),
		"canceled": edit(func(c *protocol.Card, r *protocol.ReportRequest) {
			r.Payload.Status = protocol.StatusCanceled
			c.Content = json.RawMessage(`{"status":"canceled","result":null}`)
		}),
		"failed, no error": edit(func(c *protocol.Card, r *protocol.ReportRequest) {
			r.Payload.Status = protocol.StatusFailed
			c.Content = json.RawMessage(`{"status":"failed","result":null}`)
		}),
		"with error": edit(func(c *protocol.Card, r *protocol.ReportRequest) {
			r.Payload.Status = protocol.StatusFailed
			c.Content = json.RawMessage(`{"status":"failed","result":null,"error":{"code":"x","message":"m"}}`)
		}),
		"string result":     content(`{"status":"success","result":"a b \"c\" \\ \u00e9 \ud83d\ude00"}`),
		"escaped html":      content(`{"status":"success","result":"\u003cb\u003e \u0026"}`),
		"html":              content(`{"status":"success","result":"<b> &"}`),
		"line separator":    content("{\"status\":\"success\",\"result\":\"a\u2028b\"}"),
		"spaces":            content(`{"status":"success","result":{"a": 1}}`),
		"newline":           content("{\"status\":\"success\",\"result\":{\"a\":1}\n}"),
		"reordered":         content(`{"result":1,"status":"success"}`),
		"extra member":      content(`{"status":"success","result":1,"x":2}`),
		"duplicate key":     content(`{"status":"success","result":{"a":1,"a":2}}`),
		"trailing data":     content(`{"status":"success","result":1,"result":2}`),
		"not json":          content(`{"status":"success","result":nope}`),
		"bad utf8":          content("{\"status\":\"success\",\"result\":\"\xff\"}"),
		"empty result":      content(`{"status":"success","result":}`),
		"deep":              content(`{"status":"success","result":` + deep + `}`),
		"large":             content(`{"status":"success","result":"` + strings.Repeat("x", protocol.MaxCardBytes) + `"}`),
		"no content":        content(``),
		"number":            content(`{"status":"success","result":1e999}`),
		"tool.call card":    edit(func(c *protocol.Card, _ *protocol.ReportRequest) { c.Type = protocol.CardToolCall }),
		"other project":     edit(func(c *protocol.Card, _ *protocol.ReportRequest) { c.ProjectID = "p2" }),
		"other turn":        edit(func(c *protocol.Card, _ *protocol.ReportRequest) { c.AgentTurnID = "t2" }),
		"other author":      edit(func(c *protocol.Card, _ *protocol.ReportRequest) { c.AuthorID = "tool.other" }),
		"other function":    edit(func(c *protocol.Card, _ *protocol.ReportRequest) { c.FunctionName = "other" }),
		"no function":       edit(func(c *protocol.Card, r *protocol.ReportRequest) { c.FunctionName = "" }),
		"bad card id":       edit(func(c *protocol.Card, _ *protocol.ReportRequest) { c.CardID = "rc 1" }),
		"bad utf8 metadata": edit(func(c *protocol.Card, _ *protocol.ReportRequest) { c.Metadata.TraceID = "a\xffb" }),
		"unicode metadata":  edit(func(c *protocol.Card, _ *protocol.ReportRequest) { c.Metadata.TraceID = "é<&>\u2028" }),
		"unicode function": edit(func(c *protocol.Card, r *protocol.ReportRequest) {
			c.FunctionName, r.SourceFunction = "écho<>", "écho<>"
		}),
		"bad report": edit(func(_ *protocol.Card, r *protocol.ReportRequest) { r.Payload.AfterExecution = "later" }),
		"steps":      edit(func(_ *protocol.Card, r *protocol.ReportRequest) { r.Identity.StepID, r.Payload.StepID = "s1", "s1" }),
		"trace": edit(func(_ *protocol.Card, r *protocol.ReportRequest) {
			r.Identity.Traceparent, r.Identity.Tracestate = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v"
		}),
	}
	certain := 0
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			in, ok := resultFromRequest(c.card, c.req, 1<<20)
			h, data := reportResultWire(c.card, c.req)
			parsed, vs := protocol.ParseReportResult(h, data)
			if !ok {
				return
			}
			certain++
			require.Empty(t, vs, "taken as certainly valid, but the parser refuses it")
			r := parsed.Report
			want := reportInput{project: r.ProjectID, channel: r.ChannelID, id: r.Identity, sourceID: r.SourceID,
				sourceFunction: r.SourceFunction, payload: r.Payload, stepID: in.stepID, op: protocol.OpReportResult,
				result: &resultCard{card: parsed.Card, stored: parsed.Stored}}
			require.Equal(t, want, *in)
			require.Equal(t, string(parsed.Stored), string(in.result.stored))
			require.Equal(t, string(parsed.Card.Content), string(in.result.card.Content))
		})
	}
	require.GreaterOrEqual(t, certain, 10)
	// The room the stream leaves for the card is the ledger's check.
	_, ok := resultFromRequest(card, req, 10)
	require.False(t, ok)
}
