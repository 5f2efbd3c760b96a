package ledger_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

const opsActor = "ops-anna"

// operatorActions reads cgledger_operator_actions_total{action,outcome}.
func operatorActions(t *testing.T, reg *prometheus.Registry, action, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "cgledger_operator_actions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["action"] == action && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func violationFields(e *protocol.Error) []string {
	var fs []string
	for _, v := range e.Violations {
		fs = append(fs, v.Field)
	}
	return fs
}

// TestOperatorCancel: an admin cancels any agent's call: a dispatched one
// by its cancel entry (CG-Actor the admin; once: a repeat is a duplicate),
// a held one by the decision canceled (approver the admin, the worker
// woken with a canceled result); a reported call is refused conflict, an
// unknown one unknown_call, a bad body with every violation; each refusal
// recorded and counted.
func TestOperatorCancel(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)

	// A dispatched call of the agent, canceled by the operator.
	running, req := deadlineCall("turn-r", "c1", "echo", 0)
	_, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	res, err := l.OperatorCancel(ctx, opsActor, protocol.OperatorCancelRequest{ProjectID: project, AgentTurnID: running.turn, ToolCallID: running.id, Reason: "runaway spend"})
	require.NoError(t, err)
	require.Equal(t, protocol.KindCancel, res.Entry)
	require.False(t, res.Duplicate)
	entries := e.subjectEntries(t, protocol.CancelSubject("v1", project, channel, running.turn, running.id))
	require.Len(t, entries, 1)
	require.Equal(t, opsActor, entries[0].Header.Get(protocol.HeaderActor), "the admin is recorded as who asked")
	var ce protocol.CancelEntry
	require.NoError(t, json.Unmarshal(entries[0].Data, &ce))
	require.Equal(t, "runaway spend", ce.Reason)
	require.Equal(t, agent, ce.AgentID, "the call's agent, not the operator")
	canceled, err := l.Canceled(ctx, project, channel, running.turn, running.id)
	require.NoError(t, err)
	require.True(t, canceled)
	again, err := l.OperatorCancel(ctx, opsActor, protocol.OperatorCancelRequest{ProjectID: project, AgentTurnID: running.turn, ToolCallID: running.id, Reason: "again"})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, res.Seq, again.Seq)
	// The worker's own cancel now finds the operator's.
	wc, err := l.Cancel(ctx, protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: running.turn, ToolCallID: running.id})
	require.NoError(t, err)
	require.True(t, wc.Duplicate)
	require.Equal(t, res.Seq, wc.Seq)

	// A held call: its decision is canceled, by the operator.
	registerGated(t, l, "wire", 3_600_000, ", approvers: [alice]")
	held, req := deadlineCall("turn-h", "c1", "wire", 0)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	hres, err := l.OperatorCancel(ctx, opsActor, protocol.OperatorCancelRequest{ProjectID: project, AgentTurnID: held.turn, ToolCallID: held.id, Reason: "not today"})
	require.NoError(t, err)
	require.Equal(t, protocol.KindApproval, hres.Entry)
	requireEndedBy(t, e, l, held, protocol.StatusCanceled, protocol.ErrorCodeCanceled, "")
	decisions := e.subjectEntries(t, protocol.ApprovalSubject("v1", project, channel, held.turn, held.id))
	require.Len(t, decisions, 1)
	var ae protocol.ApprovalEntry
	require.NoError(t, json.Unmarshal(decisions[0].Data, &ae))
	require.Equal(t, protocol.ApprovalCanceled, ae.Decision)
	require.Equal(t, opsActor, ae.Approver)
	require.Equal(t, "not today", ae.Reason)
	require.Equal(t, opsActor, decisions[0].Header.Get(protocol.HeaderActor))
	_, err = l.Approve(ctx, "alice", approvalOf(held))
	requireRefusal(t, err, protocol.CodeConflict)

	// A reported call: conflict, naming its status.
	done := newCall("turn-d", "c1", 1)
	rc := e.dispatchAndResult(t, done, protocol.StatusSuccess)
	_, err = l.Report(ctx, done.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	refusedBefore := operatorActions(t, reg, protocol.OpCallCancel, "refused")
	_, err = l.OperatorCancel(ctx, opsActor, protocol.OperatorCancelRequest{ProjectID: project, AgentTurnID: done.turn, ToolCallID: done.id, Reason: "too late"})
	ref := requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, ref.Violations[0].Message, "already has a report (success)")
	require.Empty(t, e.subjectEntries(t, protocol.CancelSubject("v1", project, channel, done.turn, done.id)))

	_, err = l.OperatorCancel(ctx, opsActor, protocol.OperatorCancelRequest{ProjectID: project, AgentTurnID: "turn-x", ToolCallID: "nope", Reason: "r"})
	requireRefusal(t, err, protocol.CodeUnknownCall)

	_, err = l.OperatorCancel(ctx, "bad actor", protocol.OperatorCancelRequest{ProjectID: project, AgentTurnID: "a.b", ToolCallID: ""})
	ref = requireRefusal(t, err, protocol.CodeBadRequest)
	require.ElementsMatch(t, []string{"body.agent_turn_id", "body.tool_call_id", "body.reason", "actor"}, violationFields(ref))

	require.Equal(t, refusedBefore+3, operatorActions(t, reg, protocol.OpCallCancel, "refused"))
	require.Equal(t, float64(3), operatorActions(t, reg, protocol.OpCallCancel, "ok"))
}

// outcomeUnknownCall makes a call of a side_effectful tool whose attempt
// started and whose deadline passed without a report: the ledger ends it
// failed, S-TOOL-OUTCOME-UNKNOWN (as TestDeadlineWithAnOpenAttemptIsOutcomeUnknown).
func outcomeUnknownCall(t *testing.T, l *ledger.Ledger, turn string) call {
	t.Helper()
	ctx := ctxT(t)
	_, err := l.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: project, ToolName: "pay", Description: "moves money",
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.pay", AfterExecution: protocol.AfterSuspend,
		Parameters: json.RawMessage(`{"type":"object"}`), Determinism: protocol.DeterminismSideEffectful})
	require.NoError(t, err)
	c, req := deadlineCall(turn, "c1", "pay", 1000)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	at, err := l.StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id, ExecutorID: "svc-1"})
	require.NoError(t, err)
	require.True(t, at.Started)
	rec := awaitWoken(t, l, c)
	require.Equal(t, protocol.AttemptOutcomeUnknown, rec.Claim.AttemptOutcome)
	return c
}

// TestOperatorResolve: an admin states what became of an outcome_unknown
// call's side effect: one resolution entry (CG-Actor the admin), shown by
// call.get, the report untouched; the same request again answers the
// stored one, another is refused conflict naming it; a call not reported
// failed with S-TOOL-OUTCOME-UNKNOWN (a success, one with no report yet)
// is refused conflict; a bad body lists every violation.
func TestOperatorResolve(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	startKeeper(t, l, 5*time.Second)
	unknown := outcomeUnknownCall(t, l, "turn-u")

	r := protocol.ResolveRequest{ProjectID: project, AgentTurnID: unknown.turn, ToolCallID: unknown.id, Effect: protocol.EffectApplied, Reason: "the bank shows the transfer"}
	res, err := l.Resolve(ctx, opsActor, r)
	require.NoError(t, err)
	require.Equal(t, protocol.EffectApplied, res.Effect)
	entries := e.subjectEntries(t, protocol.ResolutionSubject("v1", project, channel, unknown.turn, unknown.id))
	require.Len(t, entries, 1)
	require.Equal(t, res.Seq, mustSeq(t, entries[0]))
	require.Equal(t, opsActor, entries[0].Header.Get(protocol.HeaderActor))
	require.Equal(t, string(protocol.KindResolution), entries[0].Header.Get(protocol.HeaderEntryKind))
	got, err := l.Resolution(ctx, project, unknown.turn, unknown.id)
	require.NoError(t, err)
	require.NotNil(t, got)
	require.Equal(t, protocol.EffectApplied, got.Effect)
	require.Equal(t, opsActor, got.Actor)
	require.Equal(t, res.Seq, got.Seq)
	require.NotZero(t, got.ReportSeq)
	rec, err := l.GetCall(ctx, project, unknown.turn, unknown.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StatusFailed, rec.Claim.Status, "the report is as it was")
	require.Len(t, e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, unknown.turn, unknown.id)), 1)

	same, err := l.Resolve(ctx, opsActor, r)
	require.NoError(t, err)
	require.Equal(t, res.Seq, same.Seq, "the same resolution again is the stored one")
	r.Effect = protocol.EffectNotApplied
	_, err = l.Resolve(ctx, opsActor, r)
	ref := requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, ref.Violations[0].Message, "already resolved: applied by "+opsActor)
	require.Len(t, e.subjectEntries(t, protocol.ResolutionSubject("v1", project, channel, unknown.turn, unknown.id)), 1, "one resolution per call")

	// A success: nothing to resolve.
	ok := newCall("turn-s", "c1", 1)
	rc := e.dispatchAndResult(t, ok, protocol.StatusSuccess)
	_, err = l.Report(ctx, ok.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	_, err = l.Resolve(ctx, opsActor, protocol.ResolveRequest{ProjectID: project, AgentTurnID: ok.turn, ToolCallID: ok.id, Effect: protocol.EffectApplied, Reason: "r"})
	ref = requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, ref.Violations[0].Message, "is success with taxonomy code none")
	none, err := l.Resolution(ctx, project, ok.turn, ok.id)
	require.NoError(t, err)
	require.Nil(t, none)

	// A failed call of another cause, and a call with no report yet.
	failed := newCall("turn-f", "c1", 1)
	rc = e.dispatchAndResult(t, failed, protocol.StatusFailed)
	_, err = l.Report(ctx, failed.reportReq(protocol.StatusFailed, rc.CardID))
	require.NoError(t, err)
	_, err = l.Resolve(ctx, opsActor, protocol.ResolveRequest{ProjectID: project, AgentTurnID: failed.turn, ToolCallID: failed.id, Effect: protocol.EffectNotApplied, Reason: "r"})
	requireRefusal(t, err, protocol.CodeConflict)
	open := newCall("turn-o", "c1", 1)
	_, err = l.Dispatch(ctx, open.dispatchReq())
	require.NoError(t, err)
	_, err = l.Resolve(ctx, opsActor, protocol.ResolveRequest{ProjectID: project, AgentTurnID: open.turn, ToolCallID: open.id, Effect: protocol.EffectNotApplied, Reason: "r"})
	ref = requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, ref.Violations[0].Message, "has no report yet")

	_, err = l.Resolve(ctx, opsActor, protocol.ResolveRequest{ProjectID: project, AgentTurnID: "t", ToolCallID: "nope", Effect: protocol.EffectApplied, Reason: "r"})
	requireRefusal(t, err, protocol.CodeUnknownCall)
	_, err = l.Resolve(ctx, opsActor, protocol.ResolveRequest{ProjectID: project, AgentTurnID: unknown.turn, ToolCallID: unknown.id, Effect: "maybe", Reason: strings.Repeat("x", protocol.MaxOperatorReasonBytes+1)})
	ref = requireRefusal(t, err, protocol.CodeBadRequest)
	require.ElementsMatch(t, []string{"body.effect", "body.reason"}, violationFields(ref))

	require.Equal(t, float64(2), operatorActions(t, reg, protocol.OpCallResolve, "ok"))
	require.Equal(t, float64(6), operatorActions(t, reg, protocol.OpCallResolve, "refused"))
}

// TestOperatorAuthOnlyAnAdmin: no worker, tool, auditor or approver
// credential may publish call.cancel or call.resolve (NATS refuses them,
// nothing is recorded); an admin's, through the API, cancels another
// agent's call under its actor token, and call.get shows a call's
// resolution field to whoever may read it.
func TestOperatorAuthOnlyAnAdmin(t *testing.T) {
	e := newAuthEnv(t)
	ctx := ctxT(t)
	c, req := deadlineCall("turn-op", "c1", "echo", 0)
	_, err := e.l.Dispatch(ctx, req)
	require.NoError(t, err)
	body, err := json.Marshal(protocol.OperatorCancelRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id, Reason: "stop"})
	require.NoError(t, err)
	resolve := `{"project_id":"` + project + `","agent_turn_id":"` + c.turn + `","tool_call_id":"` + c.id + `","effect":"applied","reason":"r"}`

	// Each under the actor it may use for its own ops (an unbound worker
	// any): the op is what NATS refuses.
	for _, tc := range []struct {
		g     auth.Grant
		actor string
	}{
		{auth.Grant{Role: auth.RoleWorker, Project: project, Agent: agent}, agent},
		{auth.Grant{Role: auth.RoleWorker, Project: project}, "ops"},
		{auth.Grant{Role: auth.RoleTool, Project: project, Tool: "echo"}, "echo"},
		{auth.Grant{Role: auth.RoleAuditor, Project: project}, "ops"},
		{auth.Grant{Role: auth.RoleApprover, Project: project, Approver: "alice"}, "alice"},
	} {
		cl := e.client(t, tc.g)
		e.refusedByNATS(t, cl, protocol.APISubject(project, tc.actor, protocol.OpCallCancel), nil, string(body))
		e.refusedByNATS(t, cl, protocol.APISubject(project, tc.actor, protocol.OpCallResolve), nil, resolve)
	}
	canceled, err := e.l.Canceled(ctx, project, channel, c.turn, c.id)
	require.NoError(t, err)
	require.False(t, canceled)

	admin := e.client(t, auth.Grant{Role: auth.RoleAdmin, Project: project})
	// Another project in the body than the subject's: forbidden.
	foreign := strings.Replace(string(body), `"project_id":"`+project+`"`, `"project_id":"other"`, 1)
	r := admin.request(t, protocol.APISubject(project, "ops", protocol.OpCallCancel), nil, foreign)
	require.Equal(t, "forbidden", r.Error.Code)
	r = admin.request(t, protocol.APISubject(project, "ops", protocol.OpCallCancel), nil, string(body))
	require.True(t, r.OK, "%+v", r.Error)
	cancels := e.subjectEntries(t, protocol.CancelSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, cancels, 1)
	require.Equal(t, "ops", cancels[0].Header.Get(protocol.HeaderActor))
	// The call has no report: resolving it is refused, listed, recorded.
	r = admin.request(t, protocol.APISubject(project, "ops", protocol.OpCallResolve), nil, resolve)
	require.Equal(t, "conflict", r.Error.Code)
	require.NotZero(t, r.Error.RejectionSeq, "recorded")
}

// TestOperatorActionRefusedBeforeItsHandlerIsCounted: an admin's request on
// project p1's API subject naming project p2 in its body is refused
// forbidden by the caller check, before the op's handler, and still
// counted as an operator action refused.
func TestOperatorActionRefusedBeforeItsHandlerIsCounted(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	r := request(t, nc, protocol.APISubject("p1", "ops", protocol.OpToolPause), nil, `{"project_id":"p2","tool_name":"echo","reason":"x"}`)
	require.False(t, r.OK)
	require.Equal(t, string(protocol.CodeForbidden), string(r.Error.Code), "%+v", r.Error)
	require.Equal(t, 1.0, operatorActions(t, e.reg, protocol.OpToolPause, "refused"))
}
