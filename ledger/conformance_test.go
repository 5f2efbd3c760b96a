package ledger_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
)

func conformanceBody(subject, headers, payload string) string {
	return fmt.Sprintf(`{"project_id":%q,"run":"r1","case":"bad-args","subject":%q,"headers":%s,"payload":%s}`, project, subject, headers, payload)
}

// TestConformanceCommandAppendsMarkedCommand: conformance.command appends
// the command as described (malformed headers and payload kept), marked
// with the run and case, the actor and the call's idempotency key; the same
// run and case again is answered with the first entry; conformance.observe
// shows it and the consumer the ledger keeps for the tool.
func TestConformanceCommandAppendsMarkedCommand(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	registerPlain(t, e.l, "echo")
	subj := protocol.ToolCommandSubject("v1", project, channel, "echo")
	body := conformanceBody(subj, `{"CG-Agent-Id":["a1"],"CG-Agent-Turn-Id":["t1"],"CG-Turn-Epoch":["1"],"CG-Tool-Call-Id":["k1"],"X-Other":["a","b"]}`,
		`{"tool_call_card_id":"cc-1","after_execution":"suspend","args":{"q":1}}`)

	r := request(t, nc, protocol.APISubject(project, "ops", protocol.OpConformanceCommand), nil, body)
	require.True(t, r.OK, "%+v", r.Error)
	var res protocol.ConformanceCommandResult
	require.NoError(t, json.Unmarshal(r.Result, &res))
	require.False(t, res.Duplicate)

	ms := e.subjectEntries(t, subj)
	require.Len(t, ms, 1)
	m := ms[0]
	require.Equal(t, res.Seq, mustSeq(t, m))
	require.JSONEq(t, `{"tool_call_card_id":"cc-1","after_execution":"suspend","args":{"q":1}}`, string(m.Data))
	require.Equal(t, "command", m.Header.Get(protocol.HeaderEntryKind))
	require.Equal(t, "r1", m.Header.Get(protocol.HeaderConformance))
	require.Equal(t, "bad-args", m.Header.Get(protocol.HeaderConformanceCase))
	require.Equal(t, "ops", m.Header.Get(protocol.HeaderActor))
	require.Equal(t, protocol.IdempotencyKey(project, "t1", "k1"), m.Header.Get(protocol.HeaderIdempotencyKey))
	require.Equal(t, []string{"a", "b"}, m.Header.Values("X-Other"))
	require.Equal(t, "k1", m.Header.Get(protocol.HeaderToolCallID))

	again := request(t, nc, protocol.APISubject(project, "ops", protocol.OpConformanceCommand), nil, body)
	require.True(t, again.OK, "%+v", again.Error)
	var dup protocol.ConformanceCommandResult
	require.NoError(t, json.Unmarshal(again.Result, &dup))
	require.True(t, dup.Duplicate)
	require.Equal(t, res.Seq, dup.Seq)
	require.Len(t, e.subjectEntries(t, subj), 1, "one command per run and case")

	consumer := request(t, nc, protocol.APISubject(project, "echo", protocol.OpToolConsumer), nil, `{}`)
	require.True(t, consumer.OK, "%+v", consumer.Error)
	var tc protocol.ToolConsumer
	require.NoError(t, json.Unmarshal(consumer.Result, &tc))
	o := request(t, nc, protocol.APISubject(project, "ops", protocol.OpConformanceObserve), nil,
		fmt.Sprintf(`{"project_id":%q,"tool":"echo","from_seq":%d}`, project, res.Seq))
	require.True(t, o.OK, "%+v", o.Error)
	var obs protocol.ConformanceObserveResult
	require.NoError(t, json.Unmarshal(o.Result, &obs))
	require.NotEmpty(t, obs.Entries)
	require.Equal(t, res.Seq, obs.Entries[0].Seq)
	require.Equal(t, subj, obs.Entries[0].Subject)
	require.GreaterOrEqual(t, obs.LastSeq, res.Seq)
	require.Equal(t, obs.LastSeq+1, obs.NextSeq)
	require.Len(t, obs.Consumers, 1, "the ledger-kept consumer of echo, not the deadline keeper's nor another tool's")
	require.Equal(t, tc.Consumer, obs.Consumers[0].Name)
	require.Zero(t, obs.Consumers[0].AckFloorStreamSeq, "nobody pulled it")
	require.Equal(t, int64(tc.AckWaitMS), obs.Consumers[0].AckWaitMS)
}

// TestConformanceCommandRefusals: every violation of a conformance.command
// is listed in one refusal, recorded as a rejection of its op; a command of
// another project is forbidden; nothing is appended on a command subject.
func TestConformanceCommandRefusals(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	api := protocol.APISubject(project, "ops", protocol.OpConformanceCommand)

	r := request(t, nc, api, nil, `{"project_id":"`+project+`","run":"a.b","subject":"cg.v1.`+project+`.c.cmd.agent.w.wakeup",`+
		`"headers":{"CG-Entry-Kind":["report"],"Nats-Msg-Id":["x"],"CG-Conformance":["r2"],"CG-Idempotency-Key":["idem-0"],"bad name":["v"]},"extra":1}`)
	require.False(t, r.OK)
	require.Equal(t, "bad_request", r.Error.Code)
	require.NotZero(t, r.Error.RejectionSeq)
	var got []string
	for _, v := range r.Error.Violations {
		got = append(got, v.Field+" "+v.Code)
	}
	sort.Strings(got)
	require.Equal(t, []string{
		"body.case required", "body.extra invalid_value",
		"body.headers.CG-Conformance forbidden", "body.headers.CG-Entry-Kind forbidden", "body.headers.CG-Idempotency-Key forbidden", "body.headers.Nats-Msg-Id forbidden",
		"body.headers.bad name invalid_value",
		"body.payload required", "body.run invalid_token", "body.subject invalid_subject",
	}, got)

	decision := protocol.DecisionSubject("v1", project, channel, "echo", "t1", "k1")
	r = request(t, nc, api, nil, conformanceBody(decision, `{}`, `{}`))
	require.False(t, r.OK)
	require.Equal(t, "bad_request", r.Error.Code)
	require.Equal(t, "body.subject", r.Error.Violations[0].Field)
	require.Equal(t, "invalid_subject", r.Error.Violations[0].Code)

	r = request(t, nc, api, nil, conformanceBody(protocol.ToolCommandSubject("v1", "other", channel, "echo"), `{}`, `{}`))
	require.False(t, r.OK)
	require.Equal(t, "forbidden", r.Error.Code)
	require.Equal(t, "body.subject", r.Error.Violations[0].Field)

	rej := e.subjectEntries(t, "cg.v1.*.*.ledger.rejection.>")
	ops := map[string]int{}
	for _, m := range rej {
		var re protocol.RejectionEntry
		require.NoError(t, json.Unmarshal(m.Data, &re))
		ops[re.Op+" "+string(re.Code)]++
	}
	require.Equal(t, map[string]int{"conformance.command bad_request": 2, "conformance.command forbidden": 1}, ops)
	require.Empty(t, e.subjectEntries(t, "cg.v1.*.*.cmd.tool.>"), "nothing appended")
}

// TestConformanceOpsAdminOnly: with credentials, only an admin of the
// project may send conformance.command and conformance.observe; NATS
// refuses every other role and another project's admin, and nothing is
// written.
func TestConformanceOpsAdminOnly(t *testing.T) {
	e := newAuthEnv(t)
	subj := protocol.ToolCommandSubject("v1", project, channel, "echo")
	body := conformanceBody(subj, `{}`, `{"tool_call_card_id":"cc-1","after_execution":"suspend"}`)
	observe := fmt.Sprintf(`{"project_id":%q,"from_seq":1}`, project)
	for _, g := range []auth.Grant{
		{Role: auth.RoleWorker, Project: project},
		{Role: auth.RoleTool, Project: project, Tool: "echo"},
		{Role: auth.RoleAuditor, Project: project},
		{Role: auth.RoleApprover, Project: project, Approver: "ann"},
		{Role: auth.RoleAdmin, Project: "other"},
	} {
		c := e.client(t, g)
		actor := "echo"
		if g.Role == auth.RoleApprover {
			actor = "ann"
		}
		e.refusedByNATS(t, c, protocol.APISubject(project, actor, protocol.OpConformanceCommand), nil, body)
		e.refusedByNATS(t, c, protocol.APISubject(project, actor, protocol.OpConformanceObserve), nil, observe)
	}
	admin := e.client(t, auth.Grant{Role: auth.RoleAdmin, Project: project})
	r := admin.request(t, protocol.APISubject(project, "ops", protocol.OpConformanceCommand), nil, body)
	require.True(t, r.OK, "%+v", r.Error)
	r = admin.request(t, protocol.APISubject(project, "ops", protocol.OpConformanceObserve), nil, observe)
	require.True(t, r.OK, "%+v", r.Error)
}
