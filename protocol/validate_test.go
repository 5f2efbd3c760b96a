package protocol_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vtViol is a violation's field and code, the stable part tests assert on.
type vtViol struct{ Field, Code string }

func (v vtViol) String() string { return v.Field + "/" + v.Code }

func vtSorted(vs []vtViol) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.String()
	}
	sort.Strings(out)
	return out
}

// vtRequireViolations asserts that vs holds exactly want (field and code,
// any order, with multiplicity) and that every violation has a message.
func vtRequireViolations(t *testing.T, vs []protocol.Violation, want ...vtViol) {
	t.Helper()
	got := make([]vtViol, len(vs))
	for i, v := range vs {
		got[i] = vtViol{v.Field, v.Code}
		assert.NotEmpty(t, v.Message, "violation %+v has no message", v)
	}
	require.Equal(t, vtSorted(want), vtSorted(got), "violations: %+v", vs)
}

// vtRequireBadRequest asserts err is a bad_request *protocol.Error holding
// exactly want.
func vtRequireBadRequest(t *testing.T, err error, want ...vtViol) {
	t.Helper()
	require.Error(t, err)
	var e *protocol.Error
	require.True(t, errors.As(err, &e), "error %v (%T) is not a *protocol.Error", err, err)
	require.Equal(t, protocol.CodeBadRequest, e.Code, "error: %v", err)
	require.True(t, errors.Is(err, protocol.ErrBadRequest))
	assert.Contains(t, e.Message, fmt.Sprintf("%d violation(s)", len(want)))
	vtRequireViolations(t, e.Violations, want...)
}

const (
	vtTrace     = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	vtAgent     = "agent-1"
	vtTurn      = "turn-1"
	vtCall      = "call-1"
	vtStep      = "step-1"
	vtBox       = "box-1"
	vtEpochText = "7"
	vtEpoch     = uint64(7)
)

// vtHeader builds a header from name/value pairs, keeping names verbatim.
func vtHeader(kv ...string) nats.Header {
	h := nats.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h[kv[i]] = append(h[kv[i]], kv[i+1])
	}
	return h
}

// vtIdentityHeader is a header with every identity header set validly.
func vtIdentityHeader() nats.Header {
	return vtHeader(
		protocol.HeaderAgentID, vtAgent,
		protocol.HeaderAgentTurnID, vtTurn,
		protocol.HeaderTurnEpoch, vtEpochText,
		protocol.HeaderToolCallID, vtCall,
	)
}

func vtWith(h nats.Header, kv ...string) nats.Header {
	out := nats.Header{}
	for k, v := range h {
		out[k] = append([]string(nil), v...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = []string{kv[i+1]}
	}
	return out
}

func vtWithout(h nats.Header, names ...string) nats.Header {
	out := vtWith(h)
	for _, n := range names {
		delete(out, n)
	}
	return out
}

func hdrField(name string) string { return "header." + name }

// ---------------------------------------------------------------------------
// Identifiers and names.

func TestValidateIdentifierAndName(t *testing.T) {
	max := strings.Repeat("a", protocol.MaxIdentifierLen)
	tooLong := max + "a"
	ids := []struct {
		s         string
		ident, nm bool
	}{
		{"a", true, true},
		{"agent-1", true, true},
		{"A_b-9:x@y", true, true},
		{"!#$%&'()+,-/:;<=?@[]^`{|}~", true, true},
		{"__", true, true},
		{max, true, true},
		{"", false, false},
		{"_", false, true},
		{tooLong, false, false},
		{"tool.example", false, true},
		{"a*b", false, true},
		{"a>b", false, true},
		{"a b", false, false},
		{"a\tb", false, false},
		{"a\nb", false, false},
		{"a\x00b", false, false},
		{"a\x7fb", false, false},
		{"é", false, true},
		{"日本語", false, true},
		{"a\u00a0b", false, false}, // NBSP is whitespace
		{"a\u2028b", false, false}, // line separator
		{"a\u200bb", false, true},  // zero-width space is not unicode.IsSpace
		{"\xff", false, false},     // invalid UTF-8
		{strings.Repeat("é", 128), false, true},
		{strings.Repeat("é", 129), false, false}, // 258 bytes
	}
	for _, tc := range ids {
		assert.Equal(t, tc.ident, protocol.ValidIdentifier(tc.s), "ValidIdentifier(%q)", tc.s)
		assert.Equal(t, tc.nm, protocol.ValidName(tc.s), "ValidName(%q)", tc.s)
	}
}

// ---------------------------------------------------------------------------
// ParseEpoch and ValidTraceparent.

func TestValidateParseEpoch(t *testing.T) {
	ok := map[string]uint64{
		"0":                    0,
		"1":                    1,
		"7":                    7,
		"10":                   10,
		"1234567890":           1234567890,
		"18446744073709551615": 18446744073709551615,
	}
	for s, want := range ok {
		n, valid := protocol.ParseEpoch(s)
		assert.True(t, valid, "ParseEpoch(%q)", s)
		assert.Equal(t, want, n, "ParseEpoch(%q)", s)
	}
	for _, s := range []string{
		"", "00", "01", "007", "+1", "+0", "-1", "-0", " 1", "1 ", "1\n", "1.0", "1e3", "0x1", "0b1", "0o7",
		"1_000", "18446744073709551616", "99999999999999999999", "abc", "١", "1,000", "∞",
	} {
		_, valid := protocol.ParseEpoch(s)
		assert.False(t, valid, "ParseEpoch(%q)", s)
	}
}

func TestValidateTraceparent(t *testing.T) {
	valid := []string{
		vtTrace,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
		"01-00000000000000000000000000000001-0000000000000001-ff",
		"fe-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	invalid := []string{
		"",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", // upper case
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
		"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  // short trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",  // short parent id
		"0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-00", // extra field
		"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
		"004bf92f3577b34da6a3ce929d0e0e473600f067aa0ba902b701",
		vtTrace + "\n",
		" " + vtTrace,
		"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", // non-hex
	}
	for _, s := range valid {
		assert.True(t, protocol.ValidTraceparent(s), "ValidTraceparent(%q)", s)
	}
	for _, s := range invalid {
		assert.False(t, protocol.ValidTraceparent(s), "ValidTraceparent(%q)", s)
	}
}

// ---------------------------------------------------------------------------
// ParseIdentity.

func TestValidateIdentityAccepts(t *testing.T) {
	t.Run("required only", func(t *testing.T) {
		h := vtHeader(protocol.HeaderAgentID, vtAgent, protocol.HeaderAgentTurnID, vtTurn, protocol.HeaderTurnEpoch, "0")
		id, vs := protocol.ParseIdentity(h, protocol.IdentityRules{})
		require.Empty(t, vs)
		assert.Equal(t, protocol.Identity{AgentID: vtAgent, AgentTurnID: vtTurn, TurnEpoch: 0}, id)
	})
	t.Run("everything", func(t *testing.T) {
		h := vtWith(vtIdentityHeader(),
			protocol.HeaderStepID, vtStep,
			protocol.HeaderContextBoxID, vtBox,
			protocol.HeaderTraceparent, vtTrace,
			protocol.HeaderTracestate, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
			"X-Unrelated", "ignored",
		)
		id, vs := protocol.ParseIdentity(h, protocol.IdentityRules{RequireToolCallID: true, RequireStepID: true})
		require.Empty(t, vs)
		want := protocol.Identity{
			AgentID: vtAgent, AgentTurnID: vtTurn, TurnEpoch: vtEpoch, ToolCallID: vtCall, StepID: vtStep,
			ContextBoxID: vtBox, Traceparent: vtTrace, Tracestate: "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
		}
		assert.Equal(t, want, id)

		// The identity's own header parses back to it.
		again, vs := protocol.ParseIdentity(id.Header(), protocol.IdentityRules{RequireToolCallID: true, RequireStepID: true})
		require.Empty(t, vs)
		assert.Equal(t, id, again)
	})
	t.Run("max epoch and max-length ids", func(t *testing.T) {
		long := strings.Repeat("z", protocol.MaxIdentifierLen)
		h := vtHeader(protocol.HeaderAgentID, long, protocol.HeaderAgentTurnID, long, protocol.HeaderTurnEpoch, "18446744073709551615",
			protocol.HeaderTracestate, strings.Repeat("s", 512))
		id, vs := protocol.ParseIdentity(h, protocol.IdentityRules{})
		require.Empty(t, vs)
		assert.Equal(t, uint64(18446744073709551615), id.TurnEpoch)
		assert.Equal(t, long, id.AgentID)
		assert.Len(t, id.Tracestate, 512)
	})
	t.Run("empty tracestate is allowed", func(t *testing.T) {
		id, vs := protocol.ParseIdentity(vtWith(vtIdentityHeader(), protocol.HeaderTracestate, ""), protocol.IdentityRules{})
		require.Empty(t, vs)
		assert.Equal(t, "", id.Tracestate)
	})
	t.Run("a repeated non-CG header is allowed", func(t *testing.T) {
		h := vtIdentityHeader()
		h["X-Other"] = []string{"first", "second"}
		_, vs := protocol.ParseIdentity(h, protocol.IdentityRules{})
		require.Empty(t, vs)
	})
}

func TestValidateIdentityHeaderNamesAreCaseInsensitive(t *testing.T) {
	want := protocol.Identity{
		AgentID: vtAgent, AgentTurnID: vtTurn, TurnEpoch: vtEpoch, ToolCallID: vtCall, StepID: vtStep,
		ContextBoxID: vtBox, Traceparent: vtTrace, Tracestate: "k=v",
	}
	names := []string{
		protocol.HeaderAgentID, protocol.HeaderAgentTurnID, protocol.HeaderTurnEpoch, protocol.HeaderToolCallID,
		protocol.HeaderStepID, protocol.HeaderContextBoxID, protocol.HeaderTraceparent, protocol.HeaderTracestate,
	}
	values := []string{vtAgent, vtTurn, vtEpochText, vtCall, vtStep, vtBox, vtTrace, "k=v"}
	transforms := map[string]func(string) string{
		"lower": strings.ToLower,
		"upper": strings.ToUpper,
		"mixed": func(s string) string {
			b := []byte(s)
			for i := range b {
				if i%2 == 0 {
					b[i] = strings.ToUpper(string(b[i]))[0]
				} else {
					b[i] = strings.ToLower(string(b[i]))[0]
				}
			}
			return string(b)
		},
	}
	rules := protocol.IdentityRules{RequireToolCallID: true, RequireStepID: true}
	for tname, tf := range transforms {
		t.Run(tname, func(t *testing.T) {
			h := nats.Header{}
			for i, n := range names {
				h[tf(n)] = []string{values[i]}
			}
			id, vs := protocol.ParseIdentity(h, rules)
			require.Empty(t, vs)
			assert.Equal(t, want, id)
		})
	}
	t.Run("a case variant of a header already sent is a duplicate", func(t *testing.T) {
		h := vtWith(vtIdentityHeader(), "cg-agent-id", "other")
		id, vs := protocol.ParseIdentity(h, protocol.IdentityRules{})
		vtRequireViolations(t, vs, vtViol{hdrField(protocol.HeaderAgentID), protocol.VDuplicate})
		assert.Empty(t, id.AgentID, "neither value is used")
	})
	t.Run("violations name the canonical header", func(t *testing.T) {
		h := vtHeader("cg-agent-id", "a b", "CG-AGENT-TURN-ID", "", "cg-turn-epoch", "01", "TRACEPARENT", "nope")
		_, vs := protocol.ParseIdentity(h, protocol.IdentityRules{})
		vtRequireViolations(t, vs,
			vtViol{hdrField(protocol.HeaderAgentID), protocol.VInvalidToken},
			vtViol{hdrField(protocol.HeaderAgentTurnID), protocol.VEmpty},
			vtViol{hdrField(protocol.HeaderTurnEpoch), protocol.VInvalidValue},
			vtViol{hdrField(protocol.HeaderTraceparent), protocol.VInvalidValue},
		)
	})
}

// TestValidateIdentityRejects: a header present with no values is missing.
// The other cases are data: testdata/requests/identity.txt.
func TestValidateIdentityRejects(t *testing.T) {
	h := vtWithout(vtIdentityHeader(), protocol.HeaderAgentID)
	h[protocol.HeaderAgentID] = nil
	h["cg-agent-id"] = []string{}
	_, vs := protocol.ParseIdentity(h, protocol.IdentityRules{})
	vtRequireViolations(t, vs, vtViol{hdrField(protocol.HeaderAgentID), protocol.VRequired})
}

func TestValidateIdentityEpochs(t *testing.T) {
	for s, want := range map[string]uint64{"0": 0, "1": 1, "42": 42, "18446744073709551615": 1<<64 - 1} {
		id, vs := protocol.ParseIdentity(vtWith(vtIdentityHeader(), protocol.HeaderTurnEpoch, s), protocol.IdentityRules{})
		require.Empty(t, vs, "epoch %q", s)
		assert.Equal(t, want, id.TurnEpoch, "epoch %q", s)
	}
	for _, s := range []string{"00", "01", "+1", "-1", " 1", "1 ", "1.0", "1e2", "0x2a", "1_0", "18446744073709551616", "seven"} {
		id, vs := protocol.ParseIdentity(vtWith(vtIdentityHeader(), protocol.HeaderTurnEpoch, s), protocol.IdentityRules{})
		vtRequireViolations(t, vs, vtViol{hdrField(protocol.HeaderTurnEpoch), protocol.VInvalidValue})
		assert.Zero(t, id.TurnEpoch, "epoch %q", s)
	}
}

// ---------------------------------------------------------------------------
// ParseToolCommand.

var (
	vtToolSubject = protocol.ToolCommandSubject("v1", "proj-1", "chan-1", "echo")
	vtPMOSubject  = protocol.PMOCommandSubject("v1", "proj-1", "chan-1", "spawn_agent")
)

const vtPayload = `{"tool_call_card_id":"card-1","after_execution":"suspend"}`

func vtPMOHeader() nats.Header { return vtWith(vtIdentityHeader(), protocol.HeaderStepID, vtStep) }

func TestValidateToolCommandAccepts(t *testing.T) {
	tests := []struct {
		name    string
		subject string
		h       nats.Header
		data    string
		want    protocol.ToolCommandPayload
	}{
		{"minimal", vtToolSubject, vtIdentityHeader(), vtPayload,
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", AfterExecution: protocol.AfterSuspend}},
		{"terminate", vtToolSubject, vtIdentityHeader(), `{"tool_call_card_id":"card-1","after_execution":"terminate"}`,
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", AfterExecution: protocol.AfterTerminate}},
		{"whitespace around payload", vtToolSubject, vtIdentityHeader(), " \n\t" + vtPayload + "\n ",
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", AfterExecution: protocol.AfterSuspend}},
		{"unknown fields ignored", vtToolSubject, vtIdentityHeader(),
			`{"tool_call_card_id":"card-1","after_execution":"suspend","extra":{"nested":[1,2]},"note":"hi","argz":1,"Arguments":{}}`,
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", AfterExecution: protocol.AfterSuspend}},
		{"optional tool name is a free-form name", vtToolSubject, vtIdentityHeader(),
			`{"tool_call_card_id":"card-1","after_execution":"suspend","tool_name":"tool.example"}`,
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", ToolName: "tool.example", AfterExecution: protocol.AfterSuspend}},
		{"tool name need not equal the tool target", vtToolSubject, vtIdentityHeader(),
			`{"tool_call_card_id":"card-1","after_execution":"suspend","tool_name":"other"}`,
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", ToolName: "other", AfterExecution: protocol.AfterSuspend}},
		{"identity fields equal to headers", vtToolSubject, vtWith(vtIdentityHeader(), protocol.HeaderStepID, vtStep, protocol.HeaderContextBoxID, vtBox),
			`{"tool_call_card_id":"card-1","after_execution":"suspend","agent_id":"agent-1","agent_turn_id":"turn-1",` +
				`"tool_call_id":"call-1","step_id":"step-1","context_box_id":"box-1","turn_epoch":7}`,
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", AfterExecution: protocol.AfterSuspend}},
		{"turn_epoch as a string", vtToolSubject, vtIdentityHeader(),
			`{"tool_call_card_id":"card-1","after_execution":"suspend","turn_epoch":"7"}`,
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", AfterExecution: protocol.AfterSuspend}},
		{"null identity fields are absent", vtToolSubject, vtIdentityHeader(),
			`{"tool_call_card_id":"card-1","after_execution":"suspend","agent_id":null,"turn_epoch":null,"step_id":null}`,
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", AfterExecution: protocol.AfterSuspend}},
		{"pmo command", vtPMOSubject, vtPMOHeader(),
			`{"tool_call_card_id":"card-1","after_execution":"terminate","tool_name":"spawn_agent"}`,
			protocol.ToolCommandPayload{ToolCallCardID: "card-1", ToolName: "spawn_agent", AfterExecution: protocol.AfterTerminate}},
		{"lower-case headers", vtToolSubject,
			vtHeader("cg-agent-id", vtAgent, "cg-agent-turn-id", vtTurn, "cg-turn-epoch", vtEpochText, "cg-tool-call-id", vtCall),
			vtPayload, protocol.ToolCommandPayload{ToolCallCardID: "card-1", AfterExecution: protocol.AfterSuspend}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd, err := protocol.ParseToolCommand(tc.subject, tc.h, []byte(tc.data))
			require.NoError(t, err)
			require.NotNil(t, cmd)
			assert.Equal(t, tc.want, cmd.Payload)
			sub, err := protocol.ParseCommandSubject(tc.subject)
			require.NoError(t, err)
			assert.Equal(t, sub, cmd.Subject)
			assert.Equal(t, vtAgent, cmd.Identity.AgentID)
			assert.Equal(t, vtTurn, cmd.Identity.AgentTurnID)
			assert.Equal(t, vtEpoch, cmd.Identity.TurnEpoch)
			assert.Equal(t, vtCall, cmd.Identity.ToolCallID)
		})
	}
}

func TestValidateToolCommandRejects(t *testing.T) {
	// The other cases are data: testdata/requests/command_rejects.txt.
	h := vtIdentityHeader()
	tests := []struct {
		name    string
		subject string
		h       nats.Header
		data    string
		want    []vtViol
	}{
		{"no payload", vtToolSubject, h, "", []vtViol{{"payload", protocol.VRequired}}},
		{"blank payload", vtToolSubject, h, " \n\t ", []vtViol{{"payload", protocol.VRequired}}},
		{"empty subject", "", h, vtPayload, []vtViol{{"subject", protocol.VInvalidSubject}}},
		{"subject with bad tokens", "cg.v1.p*.c.cmd.tool.a b", h, vtPayload, []vtViol{{"subject", protocol.VInvalidToken}, {"subject", protocol.VInvalidToken}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd, err := protocol.ParseToolCommand(tc.subject, tc.h, []byte(tc.data))
			if len(tc.want) == 0 {
				require.NoError(t, err)
				require.NotNil(t, cmd)
				return
			}
			vtRequireBadRequest(t, err, tc.want...)
			assert.Nil(t, cmd)
		})
	}
}

// ---------------------------------------------------------------------------
// ParseCard.

// vtCardJSON returns a card as JSON with the given top-level fields
// overridden (a nil value deletes the field).
func vtCardJSON(t *testing.T, base map[string]any, override map[string]any) []byte {
	t.Helper()
	m := map[string]any{}
	for k, v := range base {
		m[k] = v
	}
	for k, v := range override {
		if v == nil {
			delete(m, k)
			continue
		}
		m[k] = v
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}

func vtCallCard() map[string]any {
	return map[string]any{
		"card_id": "cc-1", "project_id": "proj-1", "type": protocol.CardToolCall, "author_id": "agent-1",
		"agent_turn_id": "turn-1", "tool_call_id": "call-1",
		"content":  json.RawMessage(`{"tool_name":"echo","arguments":{"text":"hi"}}`),
		"metadata": map[string]any{"trace_id": "tr", "parent_step_id": "ps", "step_id": "st"},
	}
}

func vtResultCard() map[string]any {
	return map[string]any{
		"card_id": "rc-1", "project_id": "proj-1", "type": protocol.CardToolResult, "author_id": "tool.example",
		"function_name": "echo", "agent_turn_id": "turn-1", "tool_call_id": "call-1",
		"content":  json.RawMessage(`{"status":"success","result":{"text":"hi"}}`),
		"metadata": map[string]any{"trace_id": "tr", "parent_step_id": "ps", "step_id": "st"},
	}
}

// vtNull is a JSON null that survives vtCardJSON (nil deletes).
var vtNull = json.RawMessage(`null`)

func TestValidateCardAccepts(t *testing.T) {
	t.Run("tool.call normalizes content and drops unknown fields", func(t *testing.T) {
		data := []byte(`{
			"card_id": "cc-1", "project_id": "proj-1", "type": "tool.call", "author_id": "agent-1",
			"agent_turn_id": "turn-1", "tool_call_id": "call-1", "unknown_top": [1, 2],
			"content": {"tool_name": "echo", "arguments": { "text" : "hi", "n": [1, 2] }, "extra": true},
			"metadata": {"trace_id": "tr", "parent_step_id": "ps", "step_id": "st", "other": 1}
		}`)
		c, err := protocol.ParseCard(data)
		require.NoError(t, err)
		assert.Equal(t, protocol.Card{
			CardID: "cc-1", ProjectID: "proj-1", Type: protocol.CardToolCall, AuthorID: "agent-1",
			AgentTurnID: "turn-1", ToolCallID: "call-1",
			Content:  json.RawMessage(`{"tool_name":"echo","arguments":{"text":"hi","n":[1,2]}}`),
			Metadata: protocol.CardMetadata{TraceID: "tr", ParentStepID: "ps", StepID: "st"},
		}, *c)
		tc, err := c.ToolCall()
		require.NoError(t, err)
		assert.Equal(t, "echo", tc.ToolName)
		assert.JSONEq(t, `{"text":"hi","n":[1,2]}`, string(tc.Arguments))
		_, err = c.ToolResult()
		assert.Error(t, err, "a tool.call card has no tool.result content")

		// Parsing the normalized card again is the identity.
		b, err := json.Marshal(c)
		require.NoError(t, err)
		again, err := protocol.ParseCard(b)
		require.NoError(t, err)
		assert.Equal(t, c, again)
	})
	t.Run("tool.call with empty arguments and no metadata", func(t *testing.T) {
		c, err := protocol.ParseCard(vtCardJSON(t, vtCallCard(), map[string]any{
			"content": json.RawMessage(`{"tool_name":"x","arguments":{}}`), "metadata": nil,
		}))
		require.NoError(t, err)
		assert.Equal(t, `{"tool_name":"x","arguments":{}}`, string(c.Content))
		assert.Equal(t, protocol.CardMetadata{}, c.Metadata)
	})
	t.Run("tool.call keeps a function_name", func(t *testing.T) {
		c, err := protocol.ParseCard(vtCardJSON(t, vtCallCard(), map[string]any{"function_name": "fn.x"}))
		require.NoError(t, err)
		assert.Equal(t, "fn.x", c.FunctionName)
	})
	t.Run("author_id may contain dots", func(t *testing.T) {
		c, err := protocol.ParseCard(vtCardJSON(t, vtResultCard(), nil))
		require.NoError(t, err)
		assert.Equal(t, "tool.example", c.AuthorID)
		assert.Equal(t, "echo", c.FunctionName)
	})
	results := []struct {
		name, content, want string
	}{
		{"success", `{"status":"success","result":{"text":"hi"}}`, `{"status":"success","result":{"text":"hi"}}`},
		{"success with null error", `{"status":"success","result":1,"error":null}`, `{"status":"success","result":1}`},
		{"success without result", `{"status":"success"}`, `{"status":"success","result":null}`},
		{"success with scalar result", `{"status":"success","result":"text is fine inside result"}`, `{"status":"success","result":"text is fine inside result"}`},
		{"failed with error", `{"status":"failed","result":null,"error":{"code":"boom","message":"it broke"}}`,
			`{"status":"failed","result":null,"error":{"code":"boom","message":"it broke"}}`},
		{"failed with error detail", `{"status":"failed","error":{"code":"boom","detail":{"k": [1]}}}`,
			`{"status":"failed","result":null,"error":{"code":"boom","message":"","detail":{"k":[1]}}}`},
		{"timeout with error", `{"status":"timeout","error":{"code":"deadline"}}`,
			`{"status":"timeout","result":null,"error":{"code":"deadline","message":""}}`},
		{"canceled without error", `{"status":"canceled"}`, `{"status":"canceled","result":null}`},
		{"canceled with error", `{"status":"canceled","error":{"code":"user"}}`, `{"status":"canceled","result":null,"error":{"code":"user","message":""}}`},
		{"partial without error", `{"status":"partial","result":[1]}`, `{"status":"partial","result":[1]}`},
		{"partial with error", `{"status":"partial","result":[1],"error":{"code":"some"}}`, `{"status":"partial","result":[1],"error":{"code":"some","message":""}}`},
		{"unknown content fields dropped", `{"status":"success","result":{},"logs":["x"]}`, `{"status":"success","result":{}}`},
	}
	for _, tc := range results {
		t.Run("tool.result "+tc.name, func(t *testing.T) {
			c, err := protocol.ParseCard(vtCardJSON(t, vtResultCard(), map[string]any{"content": json.RawMessage(tc.content)}))
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(c.Content))
			tr, err := c.ToolResult()
			require.NoError(t, err)
			assert.True(t, protocol.ValidStatus(tr.Status))
			_, err = c.ToolCall()
			assert.Error(t, err)
		})
	}
}

// TestValidateCardRejects: a card that is only whitespace is missing. The
// other cases are data: testdata/requests/card_rejects.txt.
func TestValidateCardRejects(t *testing.T) {
	c, err := protocol.ParseCard([]byte(" "))
	vtRequireBadRequest(t, err, vtViol{"card", protocol.VRequired})
	assert.Nil(t, c)
}

// Regressions: each violation is reported once.

func TestValidateReportsEachViolationOnce(t *testing.T) {
	t.Run("tool.result function_name of the wrong type is reported once", func(t *testing.T) {
		_, err := protocol.ParseCard(vtCardJSON(t, vtResultCard(), map[string]any{"function_name": 123}))
		vtRequireBadRequest(t, err, vtViol{"card.function_name", protocol.VInvalidType})
	})
	t.Run("payload identity field of the wrong type is reported once", func(t *testing.T) {
		_, err := protocol.ParseToolCommand(vtToolSubject, vtIdentityHeader(),
			[]byte(`{"tool_call_card_id":"card-1","after_execution":"suspend","agent_id":5}`))
		vtRequireBadRequest(t, err, vtViol{"payload.agent_id", protocol.VInvalidType})
	})
}
