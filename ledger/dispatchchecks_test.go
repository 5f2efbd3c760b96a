package ledger_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// strictYAML is a tool whose schema the checks hold arguments to: q and n
// are the caller's, lang comes from options.args.defaults and api_key from
// options.envs (the caller need not give them).
const strictYAML = `
tool_name: strict
description: A tool with a strict schema.
parameters:
  type: object
  properties:
    q: {type: string}
    n: {type: integer, minimum: 1}
    lang: {type: string}
    api_key: {type: string}
  required: [q, n, lang, api_key]
  additionalProperties: false
target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.strict
after_execution: suspend
options:
  args:
    defaults: {lang: en}
  envs: {api_key: STRICT_API_KEY}
determinism: idempotent
`

// checksCall is a call of tool with arguments args.
func checksCall(turn, id, tool, args string) call {
	c := newCall(turn, id, 1)
	c.card.Content = json.RawMessage(fmt.Sprintf(`{"tool_name":%q,"arguments":%s}`, tool, args))
	return c
}

// checksBody is c's dispatch API body with the checks member checks (none
// when empty).
func checksBody(t *testing.T, c call, tool, checks string) string {
	t.Helper()
	card, err := json.Marshal(c.card)
	require.NoError(t, err)
	body := fmt.Sprintf(`{"subject":%q,"card":%s,"payload":{"tool_call_card_id":%q,"tool_name":%q,"after_execution":"suspend"}`,
		protocol.ToolCommandSubject("v1", project, channel, tool), card, c.card.CardID, tool)
	if checks != "" {
		body += `,"checks":` + checks
	}
	return body + "}"
}

func dispatchRaw(t *testing.T, nc *nats.Conn, c call, body string) rawReply {
	t.Helper()
	return request(t, nc, protocol.APISubject(project, agent, protocol.OpDispatch), c.identity().Header(), body)
}

// requireNoCall asserts no call record exists for c: the refusal wrote
// nothing but its rejection entry.
func (e *env) requireNoCall(t *testing.T, c call) {
	t.Helper()
	_, err := e.l.GetCall(ctxT(t), project, c.turn, c.id)
	require.Error(t, err, "a refused dispatch must not create its call")
}

func TestDispatchCheckRegisteredRefusesAnUnknownToolAndRecordsIt(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	ctx := ctxT(t)
	_, err := e.l.RegisterToolYAML(ctx, project, []byte(strictYAML))
	require.NoError(t, err)

	c := checksCall("turn-reg", "call-1", "strikt", `{}`)
	r := dispatchRaw(t, nc, c, checksBody(t, c, "strikt", `{"registered":true}`))
	re := e.inRefused(t, r, string(protocol.CodeNotFound), vtViol{"card.content.tool_name", protocol.VNotFound})
	require.Equal(t, protocol.OpDispatch, re.Op)
	require.Contains(t, r.Error.Violations[0].Message, "nearest: strict", "the project's nearest name is suggested")
	require.Contains(t, string(re.Request.Data), `"checks":{"registered":true}`, "the refusal records the request as made")
	e.requireNoCall(t, c)

	// Every violation at once: a card that breaks a rule too is refused
	// bad_request with both.
	c2 := checksCall("turn-reg", "call-2", "strikt", `{}`)
	c2.card.AuthorID = "not an id"
	r = dispatchRaw(t, nc, c2, checksBody(t, c2, "strikt", `{"registered":true,"arguments":true}`))
	e.inRefused(t, r, string(protocol.CodeBadRequest),
		vtViol{"card.author_id", protocol.VInvalidValue}, vtViol{"card.content.tool_name", protocol.VNotFound})

	// The same unknown tool without the check is dispatched, as always.
	c3 := checksCall("turn-reg", "call-3", "strikt", `{}`)
	r = dispatchRaw(t, nc, c3, checksBody(t, c3, "strikt", ""))
	require.True(t, r.OK, "%+v", r.Error)

	// A registered tool passes; so does a built-in one (Config.BuiltinTools).
	c4 := checksCall("turn-reg", "call-4", "strict", `{"q":"x","n":1}`)
	_, err = e.l.Dispatch(ctx, withChecks(c4.dispatchReq(), "strict", &protocol.DispatchChecks{Registered: true}))
	require.NoError(t, err)
	lb, err := ledger.Open(ctx, e.srv.Connect(t), ledger.Config{BuiltinTools: []protocol.ToolDefinition{{ToolName: "echo",
		Parameters: json.RawMessage(`{"type":"object","required":["text"]}`)}}})
	require.NoError(t, err)
	c5 := checksCall("turn-reg", "call-5", "echo", `{"text":"hi"}`)
	_, err = lb.Dispatch(ctx, withChecks(c5.dispatchReq(), "echo", &protocol.DispatchChecks{Registered: true, Arguments: true}))
	require.NoError(t, err)
	c6 := checksCall("turn-reg", "call-6", "echo", `{}`)
	_, err = lb.Dispatch(ctx, withChecks(c6.dispatchReq(), "echo", &protocol.DispatchChecks{Registered: true, Arguments: true}))
	pe, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	vtRequireViolations(t, pe.Violations, vtViol{"card.content.arguments.text", protocol.VRequired})
	require.NotZero(t, pe.Seq, "recorded")
}

// withChecks is req to tool with checks.
func withChecks(req protocol.DispatchRequest, tool string, checks *protocol.DispatchChecks) protocol.DispatchRequest {
	req.Subject = protocol.ToolCommandSubject("v1", project, channel, tool)
	req.Payload.ToolName = tool
	req.Checks = checks
	return req
}

func TestDispatchCheckArgumentsRefusesEveryViolationAndRecordsIt(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	ctx := ctxT(t)
	_, err := e.l.RegisterToolYAML(ctx, project, []byte(strictYAML))
	require.NoError(t, err)

	c := checksCall("turn-args", "call-1", "strict", `{"q":5,"n":0,"extra":true}`)
	r := dispatchRaw(t, nc, c, checksBody(t, c, "strict", `{"arguments":true}`))
	re := e.inRefused(t, r, string(protocol.CodeBadRequest),
		vtViol{"card.content.arguments", "additionalProperties"},
		vtViol{"card.content.arguments.n", "minimum"},
		vtViol{"card.content.arguments.q", "type"})
	require.Contains(t, string(re.Request.Data), `"checks":{"arguments":true}`)
	e.requireNoCall(t, c)

	// A missing member is its own violation; members the tool's options
	// supply (lang from defaults, api_key from envs) are not the caller's
	// to give, and a bad value in a member they supply is the executor's
	// to report, not the dispatch's.
	c2 := checksCall("turn-args", "call-2", "strict", `{"q":"x"}`)
	r = dispatchRaw(t, nc, c2, checksBody(t, c2, "strict", `{"arguments":true}`))
	e.inRefused(t, r, string(protocol.CodeBadRequest), vtViol{"card.content.arguments.n", protocol.VRequired})
	c3 := checksCall("turn-args", "call-3", "strict", `{"q":"x","n":2,"api_key":7}`)
	r = dispatchRaw(t, nc, c3, checksBody(t, c3, "strict", `{"arguments":true}`))
	require.True(t, r.OK, "an options.envs member is the executor's: %+v", r.Error)

	// Arguments that are not an object: the card's own rule, with the
	// check's refusal in the same answer (nothing more to check).
	c4 := checksCall("turn-args", "call-4", "strict", `[1]`)
	r = dispatchRaw(t, nc, c4, checksBody(t, c4, "strict", `{"arguments":true,"registered":true}`))
	e.inRefused(t, r, string(protocol.CodeBadRequest), vtViol{"card.content.arguments", protocol.VInvalidType})

	// The checks member's own rules.
	c5 := checksCall("turn-args", "call-5", "strict", `{"q":"x","n":1}`)
	r = dispatchRaw(t, nc, c5, checksBody(t, c5, "strict", `{"arguments":"yes","schema":true}`))
	e.inRefused(t, r, string(protocol.CodeBadRequest),
		vtViol{"body.checks.arguments", protocol.VInvalidType}, vtViol{"body.checks.schema", protocol.VInvalidValue})
}

// TestDispatchChecksFingerprint: a dispatch without checks keeps the
// fingerprint it always had (so calls dispatched before checks existed
// are repeated as duplicates), {} asks for nothing and is the same
// dispatch, and the checks, when given, are part of what makes a repeat
// the same dispatch: a repeat with them is a duplicate, even once its
// arguments no longer pass (the call was taken), and one without them a
// conflict.
func TestDispatchChecksFingerprint(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.RegisterToolYAML(ctx, project, []byte(strictYAML))
	require.NoError(t, err)

	plain := newCall("turn-fp", "call-fp", 1)
	_, err = e.l.Dispatch(ctx, plain.dispatchReq())
	require.NoError(t, err)
	rec, err := e.l.GetCall(ctx, project, plain.turn, plain.id)
	require.NoError(t, err)
	// The fingerprint this dispatch had before dispatch checks existed.
	require.Equal(t, plainFingerprint, rec.DispatchFingerprint)
	empty := plain.dispatchReq()
	empty.Checks = &protocol.DispatchChecks{}
	d, err := e.l.Dispatch(ctx, empty)
	require.NoError(t, err)
	require.True(t, d.Duplicate, "checks asking for nothing are no checks")

	c := checksCall("turn-fp", "call-ck", "strict", `{"q":"x","n":1}`)
	req := withChecks(c.dispatchReq(), "strict", &protocol.DispatchChecks{Registered: true, Arguments: true})
	first, err := e.l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	again, err := e.l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.CommandSeq, again.CommandSeq)

	// The tool's schema changes: n must now be at least 5. The call was
	// taken, so its repeat is still its duplicate; a new call is refused.
	_, err = e.l.RegisterToolYAML(ctx, project, []byte(strings.Replace(strictYAML, "minimum: 1", "minimum: 5", 1)))
	require.NoError(t, err)
	again, err = e.l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	fresh := checksCall("turn-fp", "call-new", "strict", `{"q":"x","n":1}`)
	_, err = e.l.Dispatch(ctx, withChecks(fresh.dispatchReq(), "strict", &protocol.DispatchChecks{Arguments: true}))
	require.ErrorIs(t, err, protocol.ErrBadRequest)

	without := req
	without.Checks = nil
	_, err = e.l.Dispatch(ctx, without)
	require.ErrorIs(t, err, protocol.ErrConflict, "the same call without its checks is another dispatch")
}

// plainFingerprint is newCall("turn-fp", "call-fp", 1)'s dispatch
// fingerprint, as the ledger computed it before dispatch checks existed.
const plainFingerprint = "e1a2298fc656764d576f2a9c903d37cf2cd1f78ee59dc310c20a47a1481eb6ec"
