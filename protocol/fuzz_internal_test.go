package protocol

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// Native fuzz tests for the request parsers. Seed corpora live both here
// (f.Add) and under testdata/fuzz/<FuzzName>/. Common properties: the parsers
// never panic; a refusal is a bad_request *Error listing at least one
// violation, each with a field path and a code; an acceptance satisfies the
// invariants the rest of the ledger relies on.

// fzCheckBadRequest fails unless err is a bad_request *Error with at least
// one well-formed violation.
func fzCheckBadRequest(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *Error", err, err)
	}
	if e.Code != CodeBadRequest {
		t.Fatalf("error code %q, want %q: %v", e.Code, CodeBadRequest, err)
	}
	if !errors.Is(err, ErrBadRequest) {
		t.Fatalf("errors.Is(%v, ErrBadRequest) is false", err)
	}
	fzCheckViolations(t, e.Violations)
	return e
}

func fzCheckViolations(t *testing.T, vs []Violation) {
	t.Helper()
	if len(vs) == 0 {
		t.Fatalf("refusal lists no violations")
	}
	for i, v := range vs {
		if v.Field == "" || v.Code == "" || v.Message == "" {
			t.Fatalf("violation %d is incomplete: %+v", i, v)
		}
	}
}

// ---------------------------------------------------------------------------

func FuzzParseSubject(f *testing.F) {
	for _, s := range []string{
		"cg.v1.p.c.cmd.tool.echo",
		"cg.v1.p.c.cmd.tool.a.b.c",
		"cg.v1.p.c.cmd.sys.pmo.internal.spawn",
		"cg.v1.p.c.cmd.agent.w.wakeup",
		"cg.v1.p.c.ledger.report.t.c",
		"cg.v1.p.c.ledger.duplicate.t.c",
		"cg.v1.p.c.ledger.wakeup_skipped.t.c",
		"cg.v1.p.c.ledger.rejection.bad_request",
		"cg.v1._._.ledger.rejection.bad_request",
		"cg.v1.p.card.x",
		"cg.v1.p.roster.a",
		"cg.v1._._.ledger.skip.42",
		"cg.v1._._.ledger.skip.042",
		"cg.v1.p.c.ledger.skip.42",
		"",
		"cg",
		"cg.v1.p.c.cmd.tool.",
		"cg.v1.p.c.cmd.tool.*",
		"cg.v1.p.c.cmd.tool.>",
		"cg.V1.p*.c>.cmd.tool.a b.*",
		"cg.v1._.c.cmd.tool.x",
		"nats.v1.p.c.cmd.tool.x",
		"cg.v1.p.card.x.y",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sub, err := ParseSubject(s)
		cmd, cerr := ParseCommandSubject(s)
		if err != nil {
			fzCheckBadRequest(t, err)
			if !reflect.DeepEqual(sub, Subject{}) {
				t.Fatalf("failed parse returned non-zero subject %+v", sub)
			}
			if cerr == nil {
				t.Fatalf("ParseCommandSubject accepted %q that ParseSubject refused", s)
			}
			fzCheckBadRequest(t, cerr)
			return
		}
		if sub.Kind == SubjectUnknown {
			t.Fatalf("accepted %q with unknown kind", s)
		}
		if got := sub.String(); got != s {
			t.Fatalf("String() = %q, want the input %q (%+v)", got, s, sub)
		}
		again, err := ParseSubject(sub.String())
		if err != nil {
			t.Fatalf("re-parse of %q: %v", sub.String(), err)
		}
		if !reflect.DeepEqual(sub, again) {
			t.Fatalf("re-parse differs:\n got %+v\nwant %+v", again, sub)
		}
		if !ValidVersion(sub.Version) {
			t.Fatalf("accepted invalid version %q", sub.Version)
		}
		ids := map[string]string{}
		var built string
		switch sub.Kind {
		case SubjectToolCommand:
			if len(sub.Target) == 0 {
				t.Fatalf("tool command %q without target", s)
			}
			for _, tok := range sub.Target {
				if !ValidIdentifier(tok) {
					t.Fatalf("accepted %q with invalid target token %q", s, tok)
				}
			}
			ids["project"], ids["channel"] = sub.Project, sub.Channel
			built = ToolCommandSubject(sub.Version, sub.Project, sub.Channel, sub.Target...)
		case SubjectPMOCommand:
			ids["project"], ids["channel"], ids["tool"] = sub.Project, sub.Channel, sub.Tool
			built = PMOCommandSubject(sub.Version, sub.Project, sub.Channel, sub.Tool)
		case SubjectWakeup:
			ids["project"], ids["channel"], ids["worker_target"] = sub.Project, sub.Channel, sub.WorkerTarget
			built = WakeupSubject(sub.Version, sub.Project, sub.Channel, sub.WorkerTarget)
		case SubjectReport, SubjectDuplicate, SubjectWakeupSkip, SubjectConsumed, SubjectCancel:
			ids["project"], ids["channel"], ids["turn"], ids["call"] = sub.Project, sub.Channel, sub.AgentTurnID, sub.ToolCallID
			build := map[SubjectKind]func(string, string, string, string, string) string{
				SubjectReport: ReportSubject, SubjectDuplicate: DuplicateSubject, SubjectWakeupSkip: WakeupSkippedSubject,
				SubjectConsumed: ConsumedSubject, SubjectCancel: CancelSubject,
			}[sub.Kind]
			built = build(sub.Version, sub.Project, sub.Channel, sub.AgentTurnID, sub.ToolCallID)
		case SubjectRejection:
			ids["reason"] = sub.Reason
			if sub.Project == Unrouted && sub.Channel == Unrouted {
				built = Subject{Kind: SubjectRejection, Version: sub.Version, Project: Unrouted, Channel: Unrouted, Reason: sub.Reason}.String()
			} else {
				ids["project"], ids["channel"] = sub.Project, sub.Channel
				built = RejectionSubject(sub.Version, sub.Project, sub.Channel, Code(sub.Reason))
			}
		case SubjectCard:
			ids["project"], ids["card"] = sub.Project, sub.CardID
			built = CardSubject(sub.Version, sub.Project, sub.CardID)
		case SubjectRoster:
			ids["project"], ids["agent"] = sub.Project, sub.AgentID
			built = RosterSubject(sub.Version, sub.Project, sub.AgentID)
		case SubjectTool:
			ids["project"], ids["tool"] = sub.Project, sub.Tool
			built = ToolSubject(sub.Version, sub.Project, sub.Tool)
		case SubjectSkip:
			if sub.Project != Unrouted || sub.Channel != Unrouted || sub.Seq == 0 {
				t.Fatalf("accepted skip subject %q as %+v", s, sub)
			}
			built = SkipSubject(sub.Version, sub.Seq)
		default:
			t.Fatalf("unexpected kind %v", sub.Kind)
		}
		for name, id := range ids {
			if !ValidIdentifier(id) {
				t.Fatalf("accepted %q with invalid %s token %q", s, name, id)
			}
		}
		if built != s {
			t.Fatalf("builder for %s gives %q, want %q", sub.Kind, built, s)
		}
		if sub.IsCommand() {
			if cerr != nil || !reflect.DeepEqual(cmd, sub) {
				t.Fatalf("ParseCommandSubject(%q) = %+v, %v; want %+v", s, cmd, cerr, sub)
			}
		} else {
			e := fzCheckBadRequest(t, cerr)
			if len(e.Violations) != 1 || e.Violations[0].Code != VInvalidSubject || e.Violations[0].Field != "subject" {
				t.Fatalf("ParseCommandSubject(%q) violations %+v", s, e.Violations)
			}
		}
	})
}

// ---------------------------------------------------------------------------

// fzIdentityNames are the headers FuzzParseIdentity sets, in argument order.
var fzIdentityNames = []string{
	HeaderAgentID, HeaderAgentTurnID, HeaderTurnEpoch, HeaderToolCallID,
	HeaderStepID, HeaderContextBoxID, HeaderTraceparent, HeaderTracestate,
}

// fzHeader sets names[i] to values[i] when bit i of present is set. caseMode
// 0 keeps names, 1 lower-cases, 2 upper-cases, 3 alternates case.
func fzHeader(names, values []string, present uint16, caseMode uint8) nats.Header {
	h := nats.Header{}
	for i, n := range names {
		if present&(1<<i) == 0 {
			continue
		}
		switch caseMode % 4 {
		case 1:
			n = strings.ToLower(n)
		case 2:
			n = strings.ToUpper(n)
		case 3:
			b := []byte(n)
			for j := range b {
				if j%2 == 1 {
					b[j] = strings.ToLower(string(b[j]))[0]
				} else {
					b[j] = strings.ToUpper(string(b[j]))[0]
				}
			}
			n = string(b)
		}
		h[n] = []string{values[i]}
	}
	return h
}

func FuzzParseIdentity(f *testing.F) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	f.Add("agent-1", "turn-1", "7", "call-1", "step-1", "box-1", tp, "k=v", uint8(0xff), uint8(0), true, true)
	f.Add("agent-1", "turn-1", "0", "", "", "", "", "", uint8(0x07), uint8(1), false, false)
	f.Add("a b", "", "01", "_", "x.y", "*", "ff-"+tp[3:], strings.Repeat("s", 513), uint8(0xff), uint8(2), true, true)
	f.Add("agent", "turn", "18446744073709551616", "call", "step", "box", strings.ToUpper(tp), "", uint8(0x0f), uint8(3), true, false)
	f.Add("", "", "", "", "", "", "", "", uint8(0), uint8(0), true, true)
	f.Fuzz(func(t *testing.T, agent, turn, epoch, call, step, box, traceparent, tracestate string, present, caseMode uint8, reqCall, reqStep bool) {
		values := []string{agent, turn, epoch, call, step, box, traceparent, tracestate}
		rules := IdentityRules{RequireToolCallID: reqCall, RequireStepID: reqStep}
		canonical := fzHeader(fzIdentityNames, values, uint16(present), 0)
		id, vs := ParseIdentity(canonical, rules)

		// Header names are case-insensitive: any casing gives the same result.
		varied := fzHeader(fzIdentityNames, values, uint16(present), caseMode)
		id2, vs2 := ParseIdentity(varied, rules)
		if !reflect.DeepEqual(id, id2) || !reflect.DeepEqual(vs, vs2) {
			t.Fatalf("header case changed the result:\n%+v %+v\n%+v %+v", id, vs, id2, vs2)
		}

		if len(vs) > 0 {
			fzCheckViolations(t, vs)
			for _, v := range vs {
				if !strings.HasPrefix(v.Field, "header.") {
					t.Fatalf("violation field %q is not a header path", v.Field)
				}
			}
			fzCheckBadRequest(t, BadRequest("identity", vs))
			return
		}
		if !ValidIdentifier(id.AgentID) || !ValidIdentifier(id.AgentTurnID) {
			t.Fatalf("accepted invalid ids %+v", id)
		}
		if n, ok := ParseEpoch(epoch); !ok || n != id.TurnEpoch {
			t.Fatalf("accepted epoch %q as %d", epoch, id.TurnEpoch)
		}
		for name, v := range map[string]string{"call": id.ToolCallID, "step": id.StepID, "box": id.ContextBoxID} {
			if v != "" && !ValidIdentifier(v) {
				t.Fatalf("accepted invalid %s id %q", name, v)
			}
		}
		if reqCall && id.ToolCallID == "" || reqStep && id.StepID == "" {
			t.Fatalf("required id missing from accepted identity %+v (rules %+v)", id, rules)
		}
		if id.Traceparent != "" && !ValidTraceparent(id.Traceparent) {
			t.Fatalf("accepted invalid traceparent %q", id.Traceparent)
		}
		if len(id.Tracestate) > 512 {
			t.Fatalf("accepted %d-byte tracestate", len(id.Tracestate))
		}
		// The identity's own header parses back to it.
		id3, vs3 := ParseIdentity(id.Header(), rules)
		if len(vs3) > 0 || !reflect.DeepEqual(id, id3) {
			t.Fatalf("Header() round trip: %+v -> %+v, %+v", id, id3, vs3)
		}
	})
}

// ---------------------------------------------------------------------------

var fzCommandNames = []string{HeaderAgentID, HeaderAgentTurnID, HeaderTurnEpoch, HeaderToolCallID, HeaderStepID}

func FuzzParseToolCommand(f *testing.F) {
	tool := ToolCommandSubject("v1", "p", "c", "echo")
	pmo := PMOCommandSubject("v1", "p", "c", "spawn")
	f.Add(tool, "agent-1", "turn-1", "7", "call-1", "", uint8(0x0f),
		[]byte(`{"tool_call_card_id":"card-1","after_execution":"suspend"}`))
	f.Add(tool, "agent-1", "turn-1", "7", "call-1", "step-1", uint8(0x1f),
		[]byte(`{"tool_call_card_id":"card-1","after_execution":"terminate","agent_id":"agent-1","turn_epoch":"7","step_id":"step-1","x":{}}`))
	f.Add(pmo, "agent-1", "turn-1", "7", "call-1", "step-1", uint8(0x1f),
		[]byte(`{"tool_call_card_id":"card-1","after_execution":"suspend","tool_name":"spawn"}`))
	f.Add(pmo, "agent-1", "turn-1", "7", "call-1", "", uint8(0x0f),
		[]byte(`{"tool_call_card_id":"card-1","after_execution":"suspend","tool_name":"other","args":null}`))
	f.Add(tool, "a b", "", "01", "_", "", uint8(0x0d),
		[]byte(`{"arguments":{},"after_execution":"later","agent_id":"x","turn_epoch":-1}`))
	f.Add("cg.v1.p.card.x", "agent-1", "turn-1", "7", "call-1", "", uint8(0x0f), []byte(`[]`))
	f.Add("", "", "", "", "", "", uint8(0), []byte(``))
	f.Add(tool, "agent-1", "turn-1", "7", "call-1", "", uint8(0x0f), []byte(`{"tool_call_card_id":`))
	f.Fuzz(func(t *testing.T, subject, agent, turn, epoch, call, step string, present uint8, data []byte) {
		h := fzHeader(fzCommandNames, []string{agent, turn, epoch, call, step}, uint16(present), 0)
		cmd, err := ParseToolCommand(subject, h, data)
		if err != nil {
			fzCheckBadRequest(t, err)
			if cmd != nil {
				t.Fatalf("refused command returned %+v", cmd)
			}
			return
		}
		if cmd == nil {
			t.Fatalf("accepted command is nil")
		}
		sub, serr := ParseCommandSubject(subject)
		if serr != nil || !reflect.DeepEqual(sub, cmd.Subject) {
			t.Fatalf("accepted subject %q: ParseCommandSubject = %+v, %v; command has %+v", subject, sub, serr, cmd.Subject)
		}
		isPMO := cmd.Subject.Kind == SubjectPMOCommand
		id, vs := ParseIdentity(h, IdentityRules{RequireToolCallID: true, RequireStepID: isPMO})
		if len(vs) > 0 || !reflect.DeepEqual(id, cmd.Identity) {
			t.Fatalf("identity %+v differs from ParseIdentity %+v, %+v", cmd.Identity, id, vs)
		}
		if cmd.Identity.ToolCallID == "" || isPMO && cmd.Identity.StepID == "" {
			t.Fatalf("accepted command without required ids: %+v", cmd.Identity)
		}
		p := cmd.Payload
		if !ValidIdentifier(p.ToolCallCardID) {
			t.Fatalf("accepted tool_call_card_id %q", p.ToolCallCardID)
		}
		if !ValidAfterExecution(p.AfterExecution) {
			t.Fatalf("accepted after_execution %q", p.AfterExecution)
		}
		if p.ToolName != "" && !ValidName(p.ToolName) {
			t.Fatalf("accepted tool_name %q", p.ToolName)
		}
		if isPMO && p.ToolName != cmd.Subject.Tool {
			t.Fatalf("accepted PMO tool_name %q for subject tool %q", p.ToolName, cmd.Subject.Tool)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(bytes.TrimSpace(data), &fields); err != nil {
			t.Fatalf("accepted payload is not a JSON object: %v", err)
		}
		for _, f := range InlineForbidden {
			if _, ok := fields[f]; ok {
				t.Fatalf("accepted payload with inline %q", f)
			}
		}
		if r := fields["turn_epoch"]; r != nil && !isNull(r) {
			var n uint64
			var s string
			if json.Unmarshal(r, &s) == nil {
				n, _ = ParseEpoch(s)
			} else {
				n, _ = ParseEpoch(string(r))
			}
			if n != cmd.Identity.TurnEpoch {
				t.Fatalf("accepted payload turn_epoch %s with header epoch %d", r, cmd.Identity.TurnEpoch)
			}
		}
	})
}

// ---------------------------------------------------------------------------

func FuzzParseCard(f *testing.F) {
	for _, s := range []string{
		`{"card_id":"cc-1","project_id":"p","type":"tool.call","author_id":"agent-1","agent_turn_id":"t","tool_call_id":"c",` +
			`"content":{"tool_name":"echo","arguments":{"text":"hi"}},"metadata":{"trace_id":"tr","parent_step_id":"ps","step_id":"st"}}`,
		`{"card_id":"rc-1","project_id":"p","type":"tool.result","author_id":"tool.example","function_name":"echo","agent_turn_id":"t","tool_call_id":"c",` +
			`"content":{"status":"success","result":{"text":"<hi> & \u2028"}}}`,
		`{"card_id":"rc-2","project_id":"p","type":"tool.result","author_id":"tool.example","function_name":"echo","agent_turn_id":"t","tool_call_id":"c",` +
			`"content":{"status":"failed","result":null,"error":{"code":"boom","message":"m","detail":{"k":1}}}}`,
		`{"card_id":"rc-3","project_id":"p","type":"tool.result","author_id":"a","function_name":"f","agent_turn_id":"t","tool_call_id":"c",` +
			`"content":{"status":"success","error":{"code":"x"}}}`,
		`{"card_id":"a.b","project_id":"","type":"tool.result","author_id":"has space","agent_turn_id":"t","tool_call_id":"_","content":"text"}`,
		`{"type":"tool.call","content":{"tool_name":"x","arguments":[]}}`,
		`{"type":"text","content":{}}`,
		`{}`,
		`[]`,
		``,
		`{"card_id":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCard(data)
		if err != nil {
			e := fzCheckBadRequest(t, err)
			for _, v := range e.Violations {
				if v.Field != "card" && !strings.HasPrefix(v.Field, "card.") {
					t.Fatalf("violation field %q is not under card", v.Field)
				}
			}
			if c != nil {
				t.Fatalf("refused card returned %+v", c)
			}
			return
		}
		fzCheckCard(t, c)

		// Normalization is idempotent: the accepted card, encoded, parses
		// back to itself.
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("encode accepted card: %v", err)
		}
		again, err := ParseCard(b)
		if err != nil {
			t.Fatalf("re-parse of accepted card %s: %v", b, err)
		}
		if !reflect.DeepEqual(c, again) {
			t.Fatalf("re-parse differs:\n got %+v\nwant %+v", again, c)
		}
	})
}

func fzCheckCard(t *testing.T, c *Card) {
	t.Helper()
	for name, id := range map[string]string{"card_id": c.CardID, "project_id": c.ProjectID, "agent_turn_id": c.AgentTurnID, "tool_call_id": c.ToolCallID} {
		if !ValidIdentifier(id) {
			t.Fatalf("accepted invalid %s %q", name, id)
		}
	}
	if !ValidName(c.AuthorID) {
		t.Fatalf("accepted invalid author_id %q", c.AuthorID)
	}
	if c.FunctionName != "" && !ValidName(c.FunctionName) {
		t.Fatalf("accepted invalid function_name %q", c.FunctionName)
	}
	if !json.Valid(c.Content) {
		t.Fatalf("normalized content is not valid JSON: %q", c.Content)
	}
	switch c.Type {
	case CardToolCall:
		tc, err := c.ToolCall()
		if err != nil {
			t.Fatalf("accepted tool.call content does not decode: %v", err)
		}
		if !ValidName(tc.ToolName) {
			t.Fatalf("accepted tool_name %q", tc.ToolName)
		}
		if len(tc.Arguments) == 0 || tc.Arguments[0] != '{' {
			t.Fatalf("accepted non-object arguments %q", tc.Arguments)
		}
	case CardToolResult:
		if c.FunctionName == "" {
			t.Fatalf("accepted tool.result without function_name")
		}
		tr, err := c.ToolResult()
		if err != nil {
			t.Fatalf("accepted tool.result content does not decode: %v", err)
		}
		if !ValidStatus(tr.Status) {
			t.Fatalf("accepted status %q", tr.Status)
		}
		if tr.Status == StatusSuccess && tr.Error != nil {
			t.Fatalf("accepted success with error %+v", tr.Error)
		}
		if (tr.Status == StatusFailed || tr.Status == StatusTimeout) && tr.Error == nil {
			t.Fatalf("accepted %s without error", tr.Status)
		}
		if tr.Error != nil {
			if tr.Error.Code == "" {
				t.Fatalf("accepted error without code")
			}
			if len(tr.Error.Detail) > 0 && tr.Error.Detail[0] != '{' {
				t.Fatalf("accepted non-object error detail %q", tr.Error.Detail)
			}
		}
	default:
		t.Fatalf("accepted card type %q", c.Type)
	}
}

// ---------------------------------------------------------------------------

var fzReportNames = []string{
	HeaderProjectID, HeaderChannelID, HeaderAgentID, HeaderAgentTurnID, HeaderTurnEpoch,
	HeaderToolCallID, HeaderStepID, HeaderSourceID, HeaderSourceFunction,
}

func FuzzParseReport(f *testing.F) {
	ok := []byte(`{"status":"success","after_execution":"suspend","tool_result_card_id":"rc-1"}`)
	f.Add("proj-1", "chan-1", "agent-1", "turn-1", "7", "call-1", "", "tool.echo", "echo", uint16(0x1bf), ok)
	f.Add("proj-1", "chan-1", "agent-1", "turn-1", "7", "call-1", "step-1", "tool.echo", "echo", uint16(0x1ff),
		[]byte(`{"status":"failed","after_execution":"terminate","tool_result_card_id":"rc-1","step_id":"step-1","turn_epoch":7,"agent_id":"agent-1"}`))
	f.Add("proj-1", "chan-1", "agent-1", "turn-1", "7", "call-1", "", "tool.echo", "echo", uint16(0x1bf),
		[]byte(`{"status":"partial","after_execution":"suspend","tool_result_card_id":"rc-1","step_id":"step-9"}`))
	f.Add("_", "a.b", "a b", "", "01", "", "", "has space", "", uint16(0x1ff),
		[]byte(`{"status":"ok","after_execution":"","tool_result_card_id":"*","result":null,"turn_epoch":"x"}`))
	f.Add("", "", "", "", "", "", "", "", "", uint16(0), []byte(``))
	f.Add("proj-1", "chan-1", "agent-1", "turn-1", "7", "call-1", "", "tool.echo", "echo", uint16(0x1bf), []byte(`"text"`))
	f.Fuzz(func(t *testing.T, project, channel, agent, turn, epoch, call, step, source, function string, present uint16, data []byte) {
		values := []string{project, channel, agent, turn, epoch, call, step, source, function}
		h := fzHeader(fzReportNames, values, present, 0)
		in, vs := ParseReport(h, data)
		if len(vs) > 0 {
			fzCheckViolations(t, vs)
			for _, v := range vs {
				if !strings.HasPrefix(v.Field, "header.") && v.Field != "payload" && !strings.HasPrefix(v.Field, "payload.") {
					t.Fatalf("violation field %q is neither a header nor a payload path", v.Field)
				}
			}
			fzCheckBadRequest(t, BadRequest("report", vs))
			// A refusal is still routed: the rejection subject is well formed.
			if _, err := ParseSubject(RejectionSubject(DefaultVersion, in.ProjectID, in.ChannelID, CodeBadRequest)); err != nil {
				t.Fatalf("rejection subject for %q/%q: %v", in.ProjectID, in.ChannelID, err)
			}
			return
		}
		for name, id := range map[string]string{"project": in.ProjectID, "channel": in.ChannelID, "agent": in.Identity.AgentID,
			"turn": in.Identity.AgentTurnID, "call": in.Identity.ToolCallID, "card": in.Payload.ToolResultCardID} {
			if !ValidIdentifier(id) {
				t.Fatalf("accepted invalid %s %q", name, id)
			}
		}
		if !ValidName(in.SourceID) || !ValidName(in.SourceFunction) {
			t.Fatalf("accepted invalid source %q / %q", in.SourceID, in.SourceFunction)
		}
		if n, ok := ParseEpoch(epoch); !ok || n != in.Identity.TurnEpoch {
			t.Fatalf("accepted epoch %q as %d", epoch, in.Identity.TurnEpoch)
		}
		if !ValidStatus(in.Payload.Status) {
			t.Fatalf("accepted status %q", in.Payload.Status)
		}
		if !ValidAfterExecution(in.Payload.AfterExecution) {
			t.Fatalf("accepted after_execution %q", in.Payload.AfterExecution)
		}
		if cmp.Or(in.Identity.StepID, in.Payload.StepID) != "" && !ValidIdentifier(cmp.Or(in.Identity.StepID, in.Payload.StepID)) {
			t.Fatalf("accepted step id %q", cmp.Or(in.Identity.StepID, in.Payload.StepID))
		}
		if in.Identity.StepID != "" && cmp.Or(in.Identity.StepID, in.Payload.StepID) != in.Identity.StepID {
			t.Fatalf("step id %q is not the header's %q", cmp.Or(in.Identity.StepID, in.Payload.StepID), in.Identity.StepID)
		}
		if in.Identity.StepID == "" && cmp.Or(in.Identity.StepID, in.Payload.StepID) != in.Payload.StepID {
			t.Fatalf("step id %q is not the payload's %q", cmp.Or(in.Identity.StepID, in.Payload.StepID), in.Payload.StepID)
		}
		if _, err := ParseSubject(ReportSubject(DefaultVersion, in.ProjectID, in.ChannelID, in.Identity.AgentTurnID, in.Identity.ToolCallID)); err != nil {
			t.Fatalf("accepted report has no valid report subject: %v", err)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(bytes.TrimSpace(data), &fields); err != nil {
			t.Fatalf("accepted payload is not a JSON object: %v", err)
		}
		for _, f := range InlineForbidden {
			if _, ok := fields[f]; ok {
				t.Fatalf("accepted report with inline %q", f)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Table tests for the unexported report parser (the API and Report paths call
// it; only its violations are visible from outside the package).

func TestParseReport(t *testing.T) {
	valid := func() nats.Header {
		h := Identity{AgentID: "agent-1", AgentTurnID: "turn-1", TurnEpoch: 7, ToolCallID: "call-1"}.Header()
		h.Set(HeaderProjectID, "proj-1")
		h.Set(HeaderChannelID, "chan-1")
		h.Set(HeaderSourceID, "tool.echo")
		h.Set(HeaderSourceFunction, "echo")
		return h
	}
	with := func(kv ...string) nats.Header {
		h := valid()
		for i := 0; i+1 < len(kv); i += 2 {
			h[kv[i]] = []string{kv[i+1]}
		}
		return h
	}
	const okPayload = `{"status":"success","after_execution":"suspend","tool_result_card_id":"rc-1"}`
	hf := func(name string) string { return "header." + name }
	type fc struct{ field, code string }
	tests := []struct {
		name     string
		h        nats.Header
		data     string
		want     []fc
		wantStep string
	}{
		{name: "valid", h: valid(), data: okPayload},
		{name: "step from header", h: with(HeaderStepID, "step-1"), data: okPayload, wantStep: "step-1"},
		{name: "step from payload when no header", h: valid(),
			data: `{"status":"failed","after_execution":"terminate","tool_result_card_id":"rc-1","step_id":"step-2"}`, wantStep: "step-2"},
		{name: "step in payload equal to header", h: with(HeaderStepID, "step-1"),
			data: `{"status":"partial","after_execution":"suspend","tool_result_card_id":"rc-1","step_id":"step-1","turn_epoch":"7"}`, wantStep: "step-1"},
		{name: "lower-case header names", h: nats.Header{
			"cg-project-id": {"proj-1"}, "cg-channel-id": {"chan-1"}, "cg-agent-id": {"agent-1"}, "cg-agent-turn-id": {"turn-1"},
			"cg-turn-epoch": {"7"}, "cg-tool-call-id": {"call-1"}, "cg-source-id": {"tool.echo"}, "cg-source-function": {"echo"},
		}, data: okPayload},
		{name: "nothing at all", h: nil, data: "", want: []fc{
			{hf(HeaderProjectID), VRequired}, {hf(HeaderChannelID), VRequired}, {hf(HeaderAgentID), VRequired},
			{hf(HeaderAgentTurnID), VRequired}, {hf(HeaderTurnEpoch), VRequired}, {hf(HeaderToolCallID), VRequired},
			{hf(HeaderSourceID), VRequired}, {hf(HeaderSourceFunction), VRequired}, {"payload", VRequired},
		}},
		{name: "empty routing headers", h: with(HeaderProjectID, "", HeaderChannelID, "", HeaderSourceID, "", HeaderSourceFunction, ""),
			data: okPayload, want: []fc{
				{hf(HeaderProjectID), VEmpty}, {hf(HeaderChannelID), VEmpty}, {hf(HeaderSourceID), VEmpty}, {hf(HeaderSourceFunction), VEmpty},
			}},
		{name: "step id must match header", h: with(HeaderStepID, "step-1"),
			data: `{"status":"success","after_execution":"suspend","tool_result_card_id":"rc-1","step_id":"step-2"}`,
			want: []fc{{"payload.step_id", VIdentityMismatch}}},
		{name: "every problem at once",
			h: with(HeaderProjectID, "_", HeaderChannelID, "a.b", HeaderAgentID, "a b", HeaderTurnEpoch, "01",
				HeaderSourceID, "has space", HeaderSourceFunction, "\t"),
			data: `{"status":"ok","after_execution":"","tool_result_card_id":"*","result":null,"args":{},"step_id":"x y","agent_turn_id":"turn-2","turn_epoch":"x"}`,
			want: []fc{
				{hf(HeaderProjectID), VInvalidToken}, {hf(HeaderChannelID), VInvalidToken}, {hf(HeaderAgentID), VInvalidToken},
				{hf(HeaderTurnEpoch), VInvalidValue}, {hf(HeaderSourceID), VInvalidValue}, {hf(HeaderSourceFunction), VInvalidValue},
				{"payload.args", VForbidden}, {"payload.result", VForbidden}, {"payload.status", VInvalidValue},
				{"payload.after_execution", VEmpty}, {"payload.tool_result_card_id", VInvalidToken}, {"payload.step_id", VInvalidToken},
				{"payload.agent_turn_id", VIdentityMismatch},
			}},
		{name: "payload not an object", h: valid(), data: `["success"]`, want: []fc{{"payload", VInvalidType}}},
		{name: "payload invalid json", h: valid(), data: `{"status":`, want: []fc{{"payload", VInvalidJSON}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in, vs := ParseReport(tc.h, []byte(tc.data))
			got := make([]fc, len(vs))
			for i, v := range vs {
				got[i] = fc{v.Field, v.Code}
			}
			// Violations are compared in any order, with multiplicity.
			want := append([]fc(nil), tc.want...)
			for _, l := range [][]fc{got, want} {
				sort.Slice(l, func(i, j int) bool { return l[i].field+"/"+l[i].code < l[j].field+"/"+l[j].code })
			}
			if !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("violations:\n got %v\nwant %v\n(%+v)", got, tc.want, vs)
			}
			if len(vs) > 0 {
				fzCheckBadRequest(t, BadRequest("report", vs))
				return
			}
			if in.ProjectID != "proj-1" || in.ChannelID != "chan-1" || in.SourceID != "tool.echo" || in.SourceFunction != "echo" {
				t.Fatalf("routing: %+v", in)
			}
			if in.Identity.AgentID != "agent-1" || in.Identity.AgentTurnID != "turn-1" || in.Identity.TurnEpoch != 7 || in.Identity.ToolCallID != "call-1" {
				t.Fatalf("identity: %+v", in.Identity)
			}
			if cmp.Or(in.Identity.StepID, in.Payload.StepID) != tc.wantStep {
				t.Fatalf("step id %q, want %q", cmp.Or(in.Identity.StepID, in.Payload.StepID), tc.wantStep)
			}
			if in.Payload.ToolResultCardID != "rc-1" {
				t.Fatalf("payload: %+v", in.Payload)
			}
		})
	}
}
