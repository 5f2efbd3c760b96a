package ledger_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// registerEchoAs registers the echo tool of newCall's calls with determinism.
func registerEchoAs(t *testing.T, l *ledger.Ledger, determinism string) {
	t.Helper()
	_, err := l.RegisterTool(ctxT(t), &protocol.ToolDefinition{ProjectID: project, ToolName: "echo", Description: "echoes",
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.echo", AfterExecution: protocol.AfterSuspend,
		Parameters: json.RawMessage(`{"type":"object"}`), Determinism: determinism})
	require.NoError(t, err)
}

// derivedOf is the call a redrive of c creates (<id>~r<n>, its card
// <card>~r<n>), as the worker would see it.
func derivedOf(c call, n string) call {
	root, _, ok := protocol.RedriveOrigin(c.id)
	if !ok {
		root = c.id
	}
	cardRoot, _, ok := protocol.RedriveOrigin(c.card.CardID)
	if !ok {
		cardRoot = c.card.CardID
	}
	d := c
	d.id = root + protocol.RedriveSeparator + n
	d.card.CardID, d.card.ToolCallID = cardRoot+protocol.RedriveSeparator+n, d.id
	return d
}

// failCall dispatches c (echo), reports it failed (a plain internal_error:
// the tool said so itself) and waits for its wakeup.
func failCall(t *testing.T, e *env, l *ledger.Ledger, c call) {
	t.Helper()
	rc := e.dispatchAndResult(t, c, protocol.StatusFailed)
	_, err := l.Report(ctxT(t), c.reportReq(protocol.StatusFailed, rc.CardID))
	require.NoError(t, err)
	awaitWoken(t, l, c)
}

func redriveReq(c call, reason string) protocol.RedriveRequest {
	return protocol.RedriveRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id, Reason: reason}
}

// TestRedriveRunsAFailedCallAgain: a failed call of an idempotent tool,
// redriven, runs again as <id>~r1: the redrive entry first (CG-Actor the
// admin), then the derived call's command with the original's subject,
// arguments and CG-Idempotency-Key; the derived call's report wakes the
// same agent with its own id while the original's report stays as it was;
// call.get shows redrive on the original and redriven_from on the derived
// call; the same actor and reason again is the stored redrive, another is
// refused naming ~r1; the derived call, failed too, redriven is ~r2.
func TestRedriveRunsAFailedCallAgain(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerEchoAs(t, l, protocol.DeterminismIdempotent)
	require.True(t, hasOperatorSeries(t, reg, protocol.OpCallRedrive, "ok"), "the series exists before the first redrive")
	require.True(t, hasOperatorSeries(t, reg, protocol.OpCallRedrive, "refused"))
	c := newCall("turn-r", "c1", 1)
	failCall(t, e, l, c)

	res, err := l.Redrive(ctx, opsActor, redriveReq(c, "upstream was down"))
	require.NoError(t, err)
	d1 := derivedOf(c, "1")
	require.Equal(t, "c1~r1", res.RedriveCallID)
	require.Equal(t, d1.card.CardID, res.RedriveCardID)
	require.False(t, res.Duplicate)
	require.NotZero(t, res.Dispatch.CommandSeq)
	require.Less(t, res.Seq, res.Dispatch.CommandSeq, "the entry before the dispatch")

	entries := e.subjectEntries(t, protocol.RedriveSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, entries, 1)
	require.Equal(t, opsActor, entries[0].Header.Get(protocol.HeaderActor))
	require.Equal(t, string(protocol.KindRedrive), entries[0].Header.Get(protocol.HeaderEntryKind))
	var entry protocol.RedriveEntry
	require.NoError(t, json.Unmarshal(entries[0].Data, &entry))
	require.Equal(t, protocol.StatusFailed, entry.Status)
	require.Equal(t, protocol.DeterminismIdempotent, entry.Determinism)
	require.Equal(t, "upstream was down", entry.Reason)
	require.Equal(t, protocol.IdempotencyKey(project, c.turn, c.id), entry.IdempotencyKey)
	require.Zero(t, entry.Dispatch.Payload.DeadlineUnixMS)

	cmdSubject := protocol.ToolCommandSubject("v1", project, channel, "echo")
	orig := callEntries(t, e, cmdSubject, c)
	cmds := callEntries(t, e, cmdSubject, d1)
	require.Len(t, cmds, 1)
	require.Equal(t, orig[0].Header.Get(protocol.HeaderIdempotencyKey), cmds[0].Header.Get(protocol.HeaderIdempotencyKey), "the same identity")
	require.Equal(t, agent, cmds[0].Header.Get(protocol.HeaderAgentID))
	var op, dp protocol.ToolCommandPayload
	require.NoError(t, json.Unmarshal(orig[0].Data, &op))
	require.NoError(t, json.Unmarshal(cmds[0].Data, &dp))
	require.Equal(t, d1.card.CardID, dp.ToolCallCardID)
	require.Equal(t, op.ToolName, dp.ToolName)
	require.Greater(t, dp.DeadlineUnixMS, op.DeadlineUnixMS, "a fresh deadline")
	card, err := l.GetCard(ctx, project, d1.card.CardID)
	require.NoError(t, err)
	require.Equal(t, d1.id, card.Card.ToolCallID)
	require.JSONEq(t, string(c.card.Content), string(card.Card.Content), "the same arguments")
	require.Equal(t, c.card.Metadata, card.Card.Metadata)

	// The derived call's report wakes the same agent, with its own id.
	rc := d1.resultCard(protocol.StatusSuccess)
	_, err = l.PutCard(ctx, rc)
	require.NoError(t, err)
	_, err = l.Report(ctx, d1.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	drec := awaitWoken(t, l, d1)
	require.Equal(t, protocol.StatusSuccess, drec.Claim.Status)
	require.Len(t, callEntries(t, e, protocol.WakeupSubject("v1", project, channel, "w1"), d1), 1)
	orec, err := l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StatusFailed, orec.Claim.Status, "the original's report is as it was")
	require.Len(t, e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id)), 1)

	// call.get: redrive on the original, redriven_from on the derived call.
	get := func(id string) protocol.CallView {
		r := request(t, e.nc, protocol.APISubject(project, agent, protocol.OpCallGet), nil, `{"project_id":"`+project+`","agent_turn_id":"`+c.turn+`","tool_call_id":"`+id+`"}`)
		require.True(t, r.OK, "%+v", r.Error)
		var v protocol.CallView
		require.NoError(t, json.Unmarshal(r.Result, &v))
		return v
	}
	v := get(c.id)
	require.NotNil(t, v.Redrive)
	require.Equal(t, res.Seq, v.Redrive.Seq)
	require.Equal(t, d1.id, v.Redrive.RedriveCallID)
	require.Empty(t, v.RedrivenFrom)
	viaClient, err := client.New(e.nc).RedriveOf(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, res.Seq, viaClient.Seq)
	v = get(d1.id)
	require.Equal(t, c.id, v.RedrivenFrom)
	require.Nil(t, v.Redrive, "a call that succeeded has none")

	// Once per call: the same request answers the stored one; another is
	// refused, naming the derived call.
	same, err := l.Redrive(ctx, opsActor, redriveReq(c, "upstream was down"))
	require.NoError(t, err)
	require.True(t, same.Duplicate)
	require.Equal(t, res.Seq, same.Seq)
	require.Equal(t, res.Dispatch.CommandSeq, same.Dispatch.CommandSeq)
	_, err = l.Redrive(ctx, opsActor, redriveReq(c, "once more"))
	ref := requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, ref.Violations[0].Message, "already redriven as c1~r1 by "+opsActor)
	require.Len(t, e.subjectEntries(t, protocol.RedriveSubject("v1", project, channel, c.turn, c.id)), 1)

	// A derived call that failed too is redriven as the root's next.
	c2 := newCall("turn-r", "c2", 1)
	failCall(t, e, l, c2)
	r1, err := l.Redrive(ctx, opsActor, redriveReq(c2, "first"))
	require.NoError(t, err)
	d21 := derivedOf(c2, "1")
	rc = d21.resultCard(protocol.StatusFailed)
	_, err = l.PutCard(ctx, rc)
	require.NoError(t, err)
	_, err = l.Report(ctx, d21.reportReq(protocol.StatusFailed, rc.CardID))
	require.NoError(t, err)
	awaitWoken(t, l, d21)
	r2, err := l.Redrive(ctx, opsActor, redriveReq(d21, "second"))
	require.NoError(t, err)
	require.Equal(t, "c2~r1", r1.RedriveCallID)
	require.Equal(t, "c2~r2", r2.RedriveCallID)
	require.Equal(t, c2.card.CardID+"~r2", r2.RedriveCardID)
	d22 := derivedOf(c2, "2")
	require.Len(t, callEntries(t, e, cmdSubject, d22), 1)
	require.Equal(t, protocol.IdempotencyKey(project, c2.turn, c2.id), callEntries(t, e, cmdSubject, d22)[0].Header.Get(protocol.HeaderIdempotencyKey))
	require.Equal(t, d21.id, get(d22.id).RedrivenFrom)

	require.Equal(t, 4.0, operatorActions(t, reg, protocol.OpCallRedrive, "ok"))
	require.Equal(t, 1.0, operatorActions(t, reg, protocol.OpCallRedrive, "refused"))
}

// TestRedriveRefusals: a call may be redriven only when its report is
// failed or timeout, its approval not denied and, for a side_effectful
// tool whose outcome is unknown, once resolved not_applied; every refusal
// is a recorded conflict listing each reason, and stores no redrive.
func TestRedriveRefusals(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	startKeeper(t, l, 5*time.Second)
	refused := func(c call, want ...string) {
		t.Helper()
		_, err := l.Redrive(ctx, opsActor, redriveReq(c, "again"))
		ref := requireRefusal(t, err, protocol.CodeConflict)
		require.Len(t, ref.Violations, len(want), "%v", ref.Violations)
		for i, w := range want {
			require.Equal(t, "body.tool_call_id", ref.Violations[i].Field)
			require.Contains(t, ref.Violations[i].Message, w)
		}
		require.Empty(t, e.subjectEntries(t, protocol.RedriveSubject("v1", project, channel, c.turn, c.id)))
	}

	ok := newCall("turn-s", "c1", 1)
	rc := e.dispatchAndResult(t, ok, protocol.StatusSuccess)
	_, err := l.Report(ctx, ok.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	refused(ok, "is success: only a call reported failed or timeout")

	open := newCall("turn-o", "c1", 1)
	_, err = l.Dispatch(ctx, open.dispatchReq())
	require.NoError(t, err)
	refused(open, "has no report yet (state dispatched)")

	registerGated(t, l, "wire", 3_600_000, "")
	canceled, req := deadlineCall("turn-c", "c1", "wire", 0)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	_, err = l.OperatorCancel(ctx, opsActor, protocol.OperatorCancelRequest{ProjectID: project, AgentTurnID: canceled.turn, ToolCallID: canceled.id, Reason: "no"})
	require.NoError(t, err)
	awaitWoken(t, l, canceled)
	refused(canceled, "is canceled")

	denied, req := deadlineCall("turn-d", "c1", "wire", 0)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	_, err = l.Deny(ctx, "carol", approvalOf(denied))
	require.NoError(t, err)
	awaitWoken(t, l, denied)
	refused(denied, "approval was denied by carol")

	// A side_effectful call whose outcome is unknown: not without a
	// resolution, not once resolved applied; after not_applied, yes.
	unknown := outcomeUnknownCall(t, l, "turn-u")
	refused(unknown, "its side effect may have applied")
	_, err = l.Resolve(ctx, opsActor, protocol.ResolveRequest{ProjectID: project, AgentTurnID: unknown.turn, ToolCallID: unknown.id, Effect: protocol.EffectApplied, Reason: "the bank shows it"})
	require.NoError(t, err)
	refused(unknown, "was resolved applied by "+opsActor)
	notApplied := outcomeUnknownCall(t, l, "turn-n")
	rs, err := l.Resolve(ctx, opsActor, protocol.ResolveRequest{ProjectID: project, AgentTurnID: notApplied.turn, ToolCallID: notApplied.id, Effect: protocol.EffectNotApplied, Reason: "the bank has nothing"})
	require.NoError(t, err)
	res, err := l.Redrive(ctx, opsActor, redriveReq(notApplied, "pay it now"))
	require.NoError(t, err)
	require.NotZero(t, res.Dispatch.CommandSeq)
	got, err := l.RedriveOf(ctx, project, notApplied.turn, notApplied.id)
	require.NoError(t, err)
	require.Equal(t, rs.Seq, got.ResolutionSeq, "the resolution it relied on")
	require.Equal(t, protocol.DeterminismSideEffectful, got.Determinism)
	require.Equal(t, protocol.CodeToolOutcomeUnknown, got.TaxonomyCode)

	// A derived id that would not be an identifier.
	long := newCall("turn-l", strings.Repeat("x", protocol.MaxIdentifierLen-2), 1)
	long.card.CardID = "cc-long"
	_, err = l.Dispatch(ctx, long.dispatchReq())
	require.NoError(t, err)
	rc = long.resultCard(protocol.StatusFailed)
	rc.CardID = "rc-long"
	_, err = l.PutCard(ctx, rc)
	require.NoError(t, err)
	_, err = l.Report(ctx, long.reportReq(protocol.StatusFailed, rc.CardID))
	require.NoError(t, err)
	awaitWoken(t, l, long)
	_, err = l.Redrive(ctx, opsActor, redriveReq(long, "again"))
	ref := requireRefusal(t, err, protocol.CodeConflict)
	require.Equal(t, protocol.VTooLarge, ref.Violations[0].Code)

	_, err = l.Redrive(ctx, opsActor, protocol.RedriveRequest{ProjectID: project, AgentTurnID: "t", ToolCallID: "nope", Reason: "r"})
	requireRefusal(t, err, protocol.CodeUnknownCall)
	_, err = l.Redrive(ctx, "bad actor", protocol.RedriveRequest{ProjectID: project, AgentTurnID: "a.b"})
	ref = requireRefusal(t, err, protocol.CodeBadRequest)
	require.ElementsMatch(t, []string{"body.agent_turn_id", "body.tool_call_id", "body.reason", "actor"}, violationFields(ref))
}

// TestRedriveRaceHasOneWinner: two different redrives of one call at once:
// exactly one is stored and dispatched, the other is refused naming it.
func TestRedriveRaceHasOneWinner(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	l2, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerEchoAs(t, l1, protocol.DeterminismPure)
	c := newCall("turn-race", "c1", 1)
	failCall(t, e, l1, c)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, l := range []*ledger.Ledger{l1, l2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = l.Redrive(ctx, []string{"ops-anna", "ops-bob"}[i], redriveReq(c, "retry"))
		}()
	}
	wg.Wait()
	var won, lost int
	for _, err := range errs {
		if err == nil {
			won++
			continue
		}
		ref := requireRefusal(t, err, protocol.CodeConflict)
		require.Contains(t, ref.Violations[0].Message, "already redriven as c1~r1")
		lost++
	}
	require.Equal(t, 1, won)
	require.Equal(t, 1, lost)
	require.Len(t, e.subjectEntries(t, protocol.RedriveSubject("v1", project, channel, c.turn, c.id)), 1)
	require.Len(t, callEntries(t, e, protocol.ToolCommandSubject("v1", project, channel, "echo"), derivedOf(c, "1")), 1)
}

// TestWorkerMayNotDispatchAReservedCallID: a worker's dispatch of an id
// ending in ~r<digits> is bad_request invalid_token on CG-Tool-Call-Id
// (over the API too), and nothing of it is stored; ~r alone, or ~r0..., is
// an ordinary id.
func TestWorkerMayNotDispatchAReservedCallID(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	ctx := ctxT(t)
	c := newCall("turn-w", "x~r1", 1)
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	ref := requireRefusal(t, err, protocol.CodeBadRequest)
	require.Len(t, ref.Violations, 2, "the call id and the card id (cc-turn-w-x~r1) are both reserved")
	require.Equal(t, "header."+protocol.HeaderToolCallID, ref.Violations[0].Field)
	require.Equal(t, protocol.VInvalidToken, ref.Violations[0].Code)
	require.Equal(t, "card.card_id", ref.Violations[1].Field)
	require.Equal(t, protocol.VInvalidToken, ref.Violations[1].Code)
	// A reserved card id under an ordinary call id is refused alone.
	rc := newCall("turn-w", "y", 1)
	rc.card.CardID = "cc-y~r2"
	req := rc.dispatchReq()
	req.Payload.ToolCallCardID = rc.card.CardID
	_, err = e.l.Dispatch(ctx, req)
	ref = requireRefusal(t, err, protocol.CodeBadRequest)
	require.Len(t, ref.Violations, 1)
	require.Equal(t, "card.card_id", ref.Violations[0].Field)
	_, err = e.l.GetCall(ctx, project, c.turn, c.id)
	require.Error(t, err, "no record")

	body, err := json.Marshal(map[string]any{"subject": c.dispatchReq().Subject, "card": c.card, "payload": c.dispatchReq().Payload})
	require.NoError(t, err)
	r := request(t, e.nc, protocol.APISubject(project, agent, protocol.OpDispatch), c.identity().Header(), string(body))
	require.False(t, r.OK)
	require.Equal(t, string(protocol.CodeBadRequest), r.Error.Code)
	require.Equal(t, "header."+protocol.HeaderToolCallID, r.Error.Violations[0].Field)

	for _, id := range []string{"x~r", "x~r01", "x~rb"} {
		_, err := e.l.Dispatch(ctx, newCall("turn-w", id, 1).dispatchReq())
		require.NoError(t, err, id)
	}
}

// TestApprovalKeeperFinishesARedrive: a redrive whose process stopped
// after its entry, before the derived call's dispatch, is dispatched by
// the approval keeper (of another process) after FinishAfter; another
// such redrive is finished at once by its request sent again.
func TestApprovalKeeperFinishesARedrive(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	l2, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerEchoAs(t, l1, protocol.DeterminismIdempotent)
	crash := errors.New("killed")
	l1.SetAfterStep(func(s ledger.Step) error {
		if s == ledger.StepRedriveEntry {
			return crash
		}
		return nil
	})
	cmdSubject := protocol.ToolCommandSubject("v1", project, channel, "echo")
	cut := newCall("turn-k", "c1", 1)
	failCall(t, e, l1, cut)
	_, err := l1.Redrive(ctx, opsActor, redriveReq(cut, "retry"))
	require.ErrorIs(t, err, crash)
	retried := newCall("turn-k", "c2", 1)
	failCall(t, e, l1, retried)
	_, err = l1.Redrive(ctx, opsActor, redriveReq(retried, "retry"))
	require.ErrorIs(t, err, crash)
	require.Len(t, e.subjectEntries(t, protocol.RedriveSubject("v1", project, channel, cut.turn, cut.id)), 1)
	require.Empty(t, callEntries(t, e, cmdSubject, derivedOf(cut, "1")), "the dispatch was cut")
	l1.SetAfterStep(nil)

	// The request again (its answer was lost): finished at once.
	again, err := l2.Redrive(ctx, opsActor, redriveReq(retried, "retry"))
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.NotZero(t, again.Dispatch.CommandSeq)
	require.Len(t, callEntries(t, e, cmdSubject, derivedOf(retried, "1")), 1)

	startApprovalKeeper(t, l2, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		return len(callEntries(t, e, cmdSubject, derivedOf(cut, "1"))) == 1
	}, time.Minute, 50*time.Millisecond, "the keeper dispatches the derived call")
	rec, err := l2.GetCall(ctx, project, cut.turn, "c1~r1")
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State)
	require.Equal(t, protocol.IdempotencyKey(project, cut.turn, cut.id), callEntries(t, e, cmdSubject, derivedOf(cut, "1"))[0].Header.Get(protocol.HeaderIdempotencyKey))
}

// TestRedriveOfAnExpiredApprovalAsksAgain: a call whose approval expired
// (it never had a command) is redriven from the command its record held,
// and the derived call, to a tool requiring approval, is held in its turn.
func TestRedriveOfAnExpiredApprovalAsksAgain(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerGated(t, l, "wire", 1000, "")
	k := startApprovalKeeper(t, l, 50*time.Millisecond)
	expired, req := deadlineCall("turn-e", "c1", "wire", 0)
	_, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	requireEndedBy(t, e, l, expired, protocol.StatusFailed, protocol.ErrorCodeBadRequest, protocol.TaxonomyApprovalExpired)
	// No keeper from here: the derived call's own approval must not
	// expire before it is looked at.
	require.NoError(t, k.Stop(ctx))
	res, err := l.Redrive(ctx, opsActor, redriveReq(expired, "carol is back"))
	require.NoError(t, err)
	require.True(t, res.Dispatch.AwaitingApproval, "the derived call asks again")
	require.Zero(t, res.Dispatch.CommandSeq)
	d := derivedOf(expired, "1")
	require.Len(t, callEntries(t, e, protocol.HeldSubject("v1", project, channel, d.turn, d.id), d), 1)
	rec, err := l.GetCall(ctx, project, d.turn, d.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateAwaitingApproval, rec.State)
	require.Equal(t, "wire", rec.ToolName)
}

// hasOperatorSeries reports whether cgledger_operator_actions_total has the
// series {action, outcome}, whatever its value.
func hasOperatorSeries(t *testing.T, reg *prometheus.Registry, action, outcome string) bool {
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
				return true
			}
		}
	}
	return false
}

// TestRedriveCardIDsAreGuarded: card.put refuses a tool.call card under a
// redrive's ids (bad_request invalid_token on each), while a tool.result
// card of a derived call stays allowed; a redrive whose derived card id
// holds any card but the one it would write is refused conflict (recorded
// as op call.redrive) and stores no entry, so no redrive is left whose
// dispatch cannot succeed.
func TestRedriveCardIDsAreGuarded(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerEchoAs(t, l, protocol.DeterminismPure)
	c := newCall("turn-g", "k", 1)
	failCall(t, e, l, c)
	d := derivedOf(c, "1")

	_, err := l.PutCard(ctx, d.card)
	ref := requireRefusal(t, err, protocol.CodeBadRequest)
	require.ElementsMatch(t, []string{"card.card_id", "card.tool_call_id"}, violationFields(ref))
	for _, v := range ref.Violations {
		require.Equal(t, protocol.VInvalidToken, v.Code)
	}
	other := d.card
	other.CardID = "cc-plain"
	_, err = l.PutCard(ctx, other)
	ref = requireRefusal(t, err, protocol.CodeBadRequest)
	require.Equal(t, []string{"card.tool_call_id"}, violationFields(ref))
	ordinary := c.card
	ordinary.CardID, ordinary.ToolCallID = "cc-z~r01", "z~r01"
	_, err = l.PutCard(ctx, ordinary)
	require.NoError(t, err, "~r01 is an ordinary id")

	// A tool.result card of the derived call, under the derived card id.
	rc := d.resultCard(protocol.StatusSuccess)
	rc.CardID = d.card.CardID
	_, err = l.PutCard(ctx, rc)
	require.NoError(t, err, "a tool.result card may carry a derived call's ids")
	_, err = l.Redrive(ctx, opsActor, redriveReq(c, "again"))
	ref = requireRefusal(t, err, protocol.CodeConflict)
	require.Len(t, ref.Violations, 1)
	require.Contains(t, ref.Violations[0].Message, "holds another card already")
	require.Empty(t, e.subjectEntries(t, protocol.RedriveSubject("v1", project, channel, c.turn, c.id)), "no redrive is stored")
	var ops []string
	for _, m := range e.subjectEntries(t, protocol.RejectionSubject("v1", project, channel, protocol.CodeConflict)) {
		var r protocol.RejectionEntry
		require.NoError(t, json.Unmarshal(m.Data, &r))
		ops = append(ops, r.Op)
	}
	require.Equal(t, []string{protocol.OpCallRedrive}, ops, "refused as call.redrive, no dispatch was tried")
	_, err = l.GetCall(ctx, project, d.turn, d.id)
	pe, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeUnknownCall, pe.Code)
}

// TestRedriveOfASideEffectfulTimeoutWithAnAttempt: a side_effectful call
// the tool itself reported timeout, with an attempt on record, may have
// applied its effect: redrive is refused until call.resolve (which now
// accepts it) says not_applied; the same timeout without an attempt (the
// tool never started) is redriven at once.
func TestRedriveOfASideEffectfulTimeoutWithAnAttempt(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	_, err := l.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: project, ToolName: "pay", Description: "moves money",
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.pay", AfterExecution: protocol.AfterSuspend,
		Parameters: json.RawMessage(`{"type":"object"}`), Determinism: protocol.DeterminismSideEffectful})
	require.NoError(t, err)
	timedOut := func(turn string, attempt bool) call {
		t.Helper()
		c, req := deadlineCall(turn, "c1", "pay", 3_600_000)
		_, err := l.Dispatch(ctx, req)
		require.NoError(t, err)
		if attempt {
			at, err := l.StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id, ExecutorID: "svc-1"})
			require.NoError(t, err)
			require.True(t, at.Started)
		}
		rc := c.resultCard(protocol.StatusTimeout)
		_, err = l.PutCard(ctx, rc)
		require.NoError(t, err)
		_, err = l.Report(ctx, c.reportReq(protocol.StatusTimeout, rc.CardID))
		require.NoError(t, err)
		awaitWoken(t, l, c)
		return c
	}

	c := timedOut("turn-ta", true)
	_, err = l.Redrive(ctx, opsActor, redriveReq(c, "again"))
	ref := requireRefusal(t, err, protocol.CodeConflict)
	require.Len(t, ref.Violations, 1)
	require.Contains(t, ref.Violations[0].Message, "is timeout, with an attempt on record: its side effect may have applied")
	require.Empty(t, e.subjectEntries(t, protocol.RedriveSubject("v1", project, channel, c.turn, c.id)))
	rs, err := l.Resolve(ctx, opsActor, protocol.ResolveRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id, Effect: protocol.EffectNotApplied, Reason: "the bank has nothing"})
	require.NoError(t, err, "a side_effectful timeout with an attempt can be resolved")
	got, err := l.Resolution(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.NotNil(t, got, "call.get shows the resolution of a timed-out call")
	require.Equal(t, rs.Seq, got.Seq)
	res, err := l.Redrive(ctx, opsActor, redriveReq(c, "pay it now"))
	require.NoError(t, err)
	stored, err := l.RedriveOf(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, rs.Seq, stored.ResolutionSeq, "the resolution it relied on")
	require.Equal(t, res.Seq, stored.Seq)

	never := timedOut("turn-tn", false)
	_, err = l.Resolve(ctx, opsActor, protocol.ResolveRequest{ProjectID: project, AgentTurnID: never.turn, ToolCallID: never.id, Effect: protocol.EffectNotApplied, Reason: "r"})
	requireRefusal(t, err, protocol.CodeConflict)
	_, err = l.Redrive(ctx, opsActor, redriveReq(never, "again"))
	require.NoError(t, err, "no attempt: the tool never started")
}
