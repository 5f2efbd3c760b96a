package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// registerGated registers tool with an approval object (extra is added
// to it, e.g. ", allow_self_approval: true").
func registerGated(t *testing.T, l *ledger.Ledger, tool string, timeoutMS int64, extra string) {
	t.Helper()
	_, err := l.RegisterToolYAML(ctxT(t), project, []byte(fmt.Sprintf(
		"tool_name: %s\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.%s\nafter_execution: suspend\napproval: {required: true, timeout_ms: %d%s}\n",
		tool, tool, timeoutMS, extra)))
	require.NoError(t, err)
}

func approvalOf(c call) protocol.ApprovalRequest {
	return protocol.ApprovalRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id, ToolCallCardID: c.card.CardID,
		ArgumentsDigest: protocol.ArgumentsDigest(json.RawMessage(`{}`)), Reason: "looks right"}
}

func startApprovalKeeper(t *testing.T, l *ledger.Ledger, finishAfter time.Duration) *ledger.ApprovalKeeper {
	t.Helper()
	k, err := l.StartApprovalKeeper(ctxT(t), ledger.ApprovalKeeperConfig{AckWait: 5 * time.Second, FinishAfter: finishAfter})
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Stop(context.Background()) })
	return k
}

// requireRefusal checks err is a recorded refusal with code, and returns it.
func requireRefusal(t *testing.T, err error, code protocol.Code) *protocol.Error {
	t.Helper()
	e, ok := protocol.AsError(err)
	require.True(t, ok, "a refusal, got %v", err)
	require.Equal(t, code, e.Code, "%v", e)
	require.NotZero(t, e.Seq, "the refusal is recorded as a rejection entry")
	return e
}

// callEntries returns the entries on filter about call c.
func callEntries(t *testing.T, e *env, filter string, c call) []*nats.Msg {
	t.Helper()
	var out []*nats.Msg
	for _, m := range e.subjectEntries(t, filter) {
		if m.Header.Get(protocol.HeaderToolCallID) == c.id && m.Header.Get(protocol.HeaderAgentTurnID) == c.turn {
			out = append(out, m)
		}
	}
	return out
}

// requireEndedBy checks that c ended with the ledger's result for its
// decision: status, error code and taxonomy code, one report, the worker
// woken.
func requireEndedBy(t *testing.T, e *env, l *ledger.Ledger, c call, status, code, taxonomy string) {
	t.Helper()
	rec := awaitWoken(t, l, c)
	require.Equal(t, status, rec.Claim.Status)
	require.Equal(t, protocol.LedgerSourceID, rec.Claim.SourceID)
	require.NotZero(t, rec.Claim.WakeupSeq, "the worker is woken")
	require.Len(t, e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id)), 1, "one report")
	card, err := l.GetCard(ctxT(t), project, rec.Claim.ToolResultCardID)
	require.NoError(t, err)
	var content struct {
		Status string `json:"status"`
		Error  struct {
			Code   string `json:"code"`
			Detail struct {
				TaxonomyCode string `json:"taxonomy_code"`
			} `json:"detail"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(card.Card.Content, &content))
	require.Equal(t, status, content.Status)
	require.Equal(t, code, content.Error.Code)
	require.Equal(t, taxonomy, content.Error.Detail.TaxonomyCode)
	require.Empty(t, callEntries(t, e, protocol.ToolCommandSubject("v1", project, channel, rec.ToolName), c), "no command was ever published")
}

// TestApprovalReleasesTheCommand: a call to a tool requiring approval is
// held (no command, no deadline; a repeat answers the same; its tool's
// report is refused); an approval publishes the command with the deadline
// counted from the decision, moves the call to dispatched and wakes the
// worker with phase approved; the tool's report is then accepted.
func TestApprovalReleasesTheCommand(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerGated(t, l, "wire", 3_600_000, ", approvers: [alice, bob]")
	c, req := deadlineCall("turn-a", "c1", "wire", 0)
	cmdSubject := protocol.ToolCommandSubject("v1", project, channel, "wire")

	res, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, res.AwaitingApproval)
	require.Zero(t, res.CommandSeq)
	require.Zero(t, res.DeadlineUnixMS, "a held call has no deadline yet")
	require.InDelta(t, time.Now().Add(time.Hour).UnixMilli(), res.ApprovalExpiresUnixMS, float64(time.Minute.Milliseconds()))
	again, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.True(t, again.AwaitingApproval)
	require.Equal(t, res.ApprovalExpiresUnixMS, again.ApprovalExpiresUnixMS)

	held := e.subjectEntries(t, protocol.HeldSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, held, 1, "one held entry")
	var he protocol.HeldEntry
	require.NoError(t, json.Unmarshal(held[0].Data, &he))
	require.Equal(t, protocol.ApprovalRequestedByDefinition, he.RequestedBy)
	require.Equal(t, []string{"alice", "bob"}, he.Approvers)
	require.Equal(t, protocol.ArgumentsDigest(json.RawMessage(`{}`)), he.ArgumentsDigest)
	require.Empty(t, callEntries(t, e, cmdSubject, c), "no command while held")
	rec, err := l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateAwaitingApproval, rec.State)

	// A tool report for a held call: refused, it has no command.
	rc := c.resultCard(protocol.StatusSuccess)
	rc.AuthorID, rc.FunctionName = "tool.wire", "wire"
	_, err = l.PutCard(ctx, rc)
	require.NoError(t, err)
	rep := c.reportReq(protocol.StatusSuccess, rc.CardID)
	rep.SourceID, rep.SourceFunction = "tool.wire", "wire"
	_, err = l.Report(ctx, rep)
	requireRefusal(t, err, protocol.CodeConflict)

	before := time.Now().UnixMilli()
	out, err := l.Approve(ctx, "alice", approvalOf(c))
	require.NoError(t, err)
	require.Equal(t, protocol.ApprovalApproved, out.Decision)
	require.NotZero(t, out.CommandSeq)
	dec := e.subjectEntries(t, protocol.ApprovalSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, dec, 1)
	var ae protocol.ApprovalEntry
	require.NoError(t, json.Unmarshal(dec[0].Data, &ae))
	require.Equal(t, "alice", ae.Approver)
	require.Equal(t, held[0].Header.Get(protocol.HeaderEntryKind), string(protocol.KindHeld))
	require.GreaterOrEqual(t, ae.DecidedUnixMS, before)
	require.Equal(t, ae.DecidedUnixMS+he.BudgetMS, out.DeadlineUnixMS, "deadline = decision + budget")

	cmds := callEntries(t, e, cmdSubject, c)
	require.Len(t, cmds, 1, "the command, once approved")
	var payload protocol.ToolCommandPayload
	require.NoError(t, json.Unmarshal(cmds[0].Data, &payload))
	require.Equal(t, out.DeadlineUnixMS, payload.DeadlineUnixMS)
	require.Equal(t, "cmd."+project+"."+c.turn+"."+c.id, cmds[0].Header.Get(protocol.HeaderMsgID))
	require.Equal(t, protocol.IdempotencyKey(project, c.turn, c.id), cmds[0].Header.Get(protocol.HeaderIdempotencyKey))
	rec, err = l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State)
	require.Equal(t, out.CommandSeq, rec.CommandSeq)
	require.Equal(t, out.DeadlineUnixMS, rec.DeadlineUnixMS)

	var phases []string
	for _, m := range callEntries(t, e, protocol.WakeupSubject("v1", project, channel, "w1"), c) {
		var w protocol.WakeupEntry
		require.NoError(t, json.Unmarshal(m.Data, &w))
		phases = append(phases, w.Phase)
	}
	require.Equal(t, []string{protocol.ApprovalApproved}, phases, "the approved wakeup")

	dup, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.False(t, dup.AwaitingApproval)
	require.Equal(t, out.CommandSeq, dup.CommandSeq)
	require.Len(t, callEntries(t, e, cmdSubject, c), 1, "a repeated dispatch publishes nothing more")

	_, err = l.Report(ctx, rep)
	require.NoError(t, err, "the tool's report of the released command")
	require.Equal(t, float64(1), counterSum(t, reg, "cgledger_approvals_total"))
}

// TestApprovalDenyAndExpiryEndTheCall: a denial ends the call failed
// (auth_failed, A-APPROVAL-DENIED) and an expiry failed (bad_request,
// P-PRECOND-APPROVAL-EXPIRED), each through one ledger report that wakes
// the worker; deciding afterwards is refused conflict naming the winner.
func TestApprovalDenyAndExpiryEndTheCall(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerGated(t, l, "wire", 1000, "")
	denied, req := deadlineCall("turn-d", "c1", "wire", 0)
	_, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	out, err := l.Deny(ctx, "carol", approvalOf(denied))
	require.NoError(t, err)
	require.NotZero(t, out.ReportSeq)
	requireEndedBy(t, e, l, denied, protocol.StatusFailed, protocol.ErrorCodeAuthFailed, protocol.TaxonomyApprovalDenied)
	_, err = l.Approve(ctx, "alice", approvalOf(denied))
	ref := requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, ref.Violations[0].Message, "denied by carol")

	startApprovalKeeper(t, l, 50*time.Millisecond)
	expired, req := deadlineCall("turn-e", "c1", "wire", 0)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	requireEndedBy(t, e, l, expired, protocol.StatusFailed, protocol.ErrorCodeBadRequest, protocol.TaxonomyApprovalExpired)
	_, err = l.Approve(ctx, "alice", approvalOf(expired))
	ref = requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, ref.Violations[0].Message, "expired by "+protocol.ApprovalExpirySource)

	// A cancel of a held call is its decision: canceled.
	canceled, req := deadlineCall("turn-c", "c1", "wire", 0)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	cr, err := l.Cancel(ctx, protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: canceled.turn, ToolCallID: canceled.id, Reason: "changed my mind"})
	require.NoError(t, err)
	require.False(t, cr.Duplicate)
	requireEndedBy(t, e, l, canceled, protocol.StatusCanceled, protocol.ErrorCodeCanceled, "")
	again, err := l.Cancel(ctx, protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: canceled.turn, ToolCallID: canceled.id})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, cr.Seq, again.Seq)
}

// TestApprovalRefusals: every refusal of approve and deny, each recorded,
// with every violation listed.
func TestApprovalRefusals(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerGated(t, l, "wire", 3_600_000, ", approvers: [alice, "+agent+"]")
	registerGated(t, l, "selfok", 3_600_000, ", allow_self_approval: true")
	c, req := deadlineCall("turn-r", "c1", "wire", 0)
	_, err := l.Dispatch(ctx, req)
	require.NoError(t, err)

	_, err = l.Approve(ctx, "alice", protocol.ApprovalRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: "nope", ToolCallCardID: "x", ArgumentsDigest: approvalOf(c).ArgumentsDigest})
	requireRefusal(t, err, protocol.CodeUnknownCall)
	_, err = ledger.ApprovalJSON(l, ctx, protocol.OpApprove, "alice", []byte(`{"project_id":"`+project+`","arguments_digest":"md5:1","reason":1}`))
	ref := requireRefusal(t, err, protocol.CodeBadRequest)
	require.Len(t, ref.Violations, 5, "agent_turn_id, tool_call_id, tool_call_card_id missing; digest form; reason type: %v", ref.Violations)

	wrong := approvalOf(c)
	wrong.ToolCallCardID, wrong.ArgumentsDigest = "cc-other", protocol.ArgumentsDigest(json.RawMessage(`{"amount":1000}`))
	_, err = l.Approve(ctx, "alice", wrong)
	ref = requireRefusal(t, err, protocol.CodeMismatch)
	require.Len(t, ref.Violations, 2, "card and digest")

	_, err = l.Approve(ctx, "mallory", wrong)
	ref = requireRefusal(t, err, protocol.CodeForbidden)
	require.Len(t, ref.Violations, 3, "unlisted approver, and the card and digest too")
	_, err = l.Approve(ctx, agent, approvalOf(c))
	ref = requireRefusal(t, err, protocol.CodeForbidden)
	require.Contains(t, ref.Violations[0].Message, "self-approval")

	_, err = l.Approve(ctx, "alice", approvalOf(c))
	require.NoError(t, err)
	_, err = l.Approve(ctx, "alice", approvalOf(c))
	ref = requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, ref.Violations[0].Message, "approved by alice")
	_, err = l.Deny(ctx, "alice", approvalOf(c))
	requireRefusal(t, err, protocol.CodeConflict)

	self, req := deadlineCall("turn-s", "c1", "selfok", 0)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	_, err = l.Approve(ctx, agent, approvalOf(self))
	require.NoError(t, err, "allowed by allow_self_approval (and any approver, none listed)")

	plain, req := deadlineCall("turn-p", "c1", "echo", 0)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	_, err = l.Approve(ctx, "alice", approvalOf(plain))
	ref = requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, ref.Violations[0].Message, "not held")
}

// TestApprovalAskedByTheWorker: a dispatch's "approval" holds a call to a
// tool that does not require it; the request is part of the dispatch's
// fingerprint; a malformed one is refused with every violation.
func TestApprovalAskedByTheWorker(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	c, req := deadlineCall("turn-w", "c1", "echo", 0)
	card, err := json.Marshal(req.Card)
	require.NoError(t, err)
	payload, err := json.Marshal(req.Payload)
	require.NoError(t, err)
	body := func(approval string) []byte {
		return []byte(fmt.Sprintf(`{"subject":%q,"card":%s,"payload":%s%s}`, req.Subject, card, payload, approval))
	}
	_, err = ledger.DispatchMsg(l, ctx, c.identity().Header(), body(`,"approval":{"required":"yes","quorum":2}`))
	ref := requireRefusal(t, err, protocol.CodeBadRequest)
	require.Len(t, ref.Violations, 2, "%v", ref.Violations)

	res, err := ledger.DispatchMsg(l, ctx, c.identity().Header(), body(`,"approval":{"required":true}`))
	require.NoError(t, err)
	require.True(t, res.AwaitingApproval)
	held := e.subjectEntries(t, protocol.HeldSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, held, 1)
	var he protocol.HeldEntry
	require.NoError(t, json.Unmarshal(held[0].Data, &he))
	require.Equal(t, protocol.ApprovalRequestedByWorker, he.RequestedBy)

	_, err = ledger.DispatchMsg(l, ctx, c.identity().Header(), body(""))
	requireRefusal(t, err, protocol.CodeConflict)
}

// TestApprovalRaceHasOneDecision: approvals, denials and cancels from many
// goroutines through two ledger processes on one server, and both
// processes' keepers expiring the call at the same moment: one decision
// per call, and one follow-up (one command, or one report).
func TestApprovalRaceHasOneDecision(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	l2, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerGated(t, l1, "wire", 1000, "")
	startApprovalKeeper(t, l1, 200*time.Millisecond)
	startApprovalKeeper(t, l2, 200*time.Millisecond)
	ledgers := []*ledger.Ledger{l1, l2}
	for i := range 4 {
		c, req := deadlineCall("turn-race", fmt.Sprintf("c%d", i), "wire", 0)
		res, err := l1.Dispatch(ctx, req)
		require.NoError(t, err)
		// Aim the deciders at the expiry, so the keepers race them.
		<-time.After(time.Until(time.UnixMilli(res.ApprovalExpiresUnixMS).Add(-20 * time.Millisecond)))
		var mu sync.Mutex
		var wins []uint64
		var wg sync.WaitGroup
		for g := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := ledgers[g%2]
				var seq uint64
				var err error
				switch g % 3 {
				case 0:
					var r protocol.ApprovalResult
					r, err = l.Approve(ctx, fmt.Sprintf("approver-%d", g), approvalOf(c))
					seq = r.Seq
				case 1:
					var r protocol.ApprovalResult
					r, err = l.Deny(ctx, fmt.Sprintf("approver-%d", g), approvalOf(c))
					seq = r.Seq
				default:
					var r protocol.CancelResult
					r, err = l.Cancel(ctx, protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id})
					if err == nil && !r.Duplicate {
						seq = r.Seq
					}
				}
				if e, refused := protocol.AsError(err); refused {
					require.Contains(t, []protocol.Code{protocol.CodeConflict}, e.Code, "%v", e)
					return
				}
				require.NoError(t, err)
				if seq != 0 {
					mu.Lock()
					wins = append(wins, seq)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		dec := e.subjectEntries(t, protocol.ApprovalSubject("v1", project, channel, c.turn, c.id))
		require.Len(t, dec, 1, "one decision")
		var ae protocol.ApprovalEntry
		require.NoError(t, json.Unmarshal(dec[0].Data, &ae))
		var rec *protocol.CallRecord
		require.Eventually(t, func() bool {
			r, err := l2.GetCall(ctx, project, c.turn, c.id)
			if err != nil || r.State == protocol.StateAwaitingApproval || r.State == protocol.StateClaimed {
				return false
			}
			rec = r
			return true
		}, time.Minute, 20*time.Millisecond)
		cmds := callEntries(t, e, protocol.ToolCommandSubject("v1", project, channel, "wire"), c)
		reports := e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id))
		if ae.Decision == protocol.ApprovalApproved {
			require.Len(t, cmds, 1, "one command")
			require.Equal(t, protocol.StateDispatched, rec.State)
			require.Empty(t, reports, "no report: the tool never answered")
		} else {
			require.Empty(t, cmds)
			require.Len(t, reports, 1, "one report")
			require.Equal(t, protocol.StateWoken, rec.State)
		}
		want := 1
		if ae.Decision == protocol.ApprovalExpired {
			want = 0
		}
		n := 0
		meta, err := dec[0].Metadata()
		require.NoError(t, err)
		for _, s := range wins {
			if s == meta.Sequence.Stream {
				n++
			}
		}
		require.Equal(t, want, n, "the winner alone is told it decided (%s)", ae.Decision)
		t.Logf("call %s: %s by %s", c.id, ae.Decision, ae.Approver)
	}
}

// TestApprovalKeeperFinishesCutDecisions: a decider that stops right after
// storing its decision (approve, deny) leaves the follow-up to the keeper
// of another process; a tool report meeting an approval whose record was
// not moved yet finishes it and is accepted.
func TestApprovalKeeperFinishesCutDecisions(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	l2, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerGated(t, l1, "wire", 3_600_000, "")
	crash := errors.New("killed")
	l1.SetAfterStep(func(s ledger.Step) error {
		if s == ledger.StepApprovalDecided {
			return crash
		}
		return nil
	})
	approved, req := deadlineCall("turn-k", "c1", "wire", 0)
	_, err := l1.Dispatch(ctx, req)
	require.NoError(t, err)
	_, err = l1.Approve(ctx, "alice", approvalOf(approved))
	require.ErrorIs(t, err, crash)
	denied, req := deadlineCall("turn-k", "c2", "wire", 0)
	_, err = l1.Dispatch(ctx, req)
	require.NoError(t, err)
	_, err = l1.Deny(ctx, "alice", approvalOf(denied))
	require.ErrorIs(t, err, crash)
	require.Empty(t, callEntries(t, e, protocol.ToolCommandSubject("v1", project, channel, "wire"), approved), "the follow-up was cut")
	require.Empty(t, e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, denied.turn, denied.id)), "the follow-up was cut")

	startApprovalKeeper(t, l2, 100*time.Millisecond)
	// Watched on the stream: a read of the call would finish it itself.
	require.Eventually(t, func() bool {
		return len(callEntries(t, e, protocol.WakeupSubject("v1", project, channel, "w1"), approved)) == 1
	}, time.Minute, 50*time.Millisecond, "the keeper releases the command and wakes the worker")
	require.Len(t, callEntries(t, e, protocol.ToolCommandSubject("v1", project, channel, "wire"), approved), 1)
	require.Eventually(t, func() bool {
		r, err := l2.GetCall(ctx, project, approved.turn, approved.id)
		return err == nil && r.State == protocol.StateDispatched
	}, time.Minute, 20*time.Millisecond)
	requireEndedBy(t, e, l2, denied, protocol.StatusFailed, protocol.ErrorCodeAuthFailed, protocol.TaxonomyApprovalDenied)

	// Cut after the command: the tool runs it and reports before the record
	// moved; its report finishes the approval and is accepted.
	l1.SetAfterStep(func(s ledger.Step) error {
		if s == ledger.StepApprovalCommand {
			return crash
		}
		return nil
	})
	fast, req := deadlineCall("turn-k", "c3", "wire", 0)
	_, err = l1.Dispatch(ctx, req)
	require.NoError(t, err)
	_, err = l1.Approve(ctx, "alice", approvalOf(fast))
	require.ErrorIs(t, err, crash)
	dup, err := l2.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.False(t, dup.AwaitingApproval)
	require.NotZero(t, dup.CommandSeq, "a repeated dispatch finishes the approval and answers its command")
	rc := fast.resultCard(protocol.StatusSuccess)
	rc.AuthorID, rc.FunctionName = "tool.wire", "wire"
	_, err = l2.PutCard(ctx, rc)
	require.NoError(t, err)
	rep := fast.reportReq(protocol.StatusSuccess, rc.CardID)
	rep.SourceID, rep.SourceFunction = "tool.wire", "wire"
	_, err = l2.Report(ctx, rep)
	require.NoError(t, err)
	rec := awaitWoken(t, l2, fast)
	require.Equal(t, protocol.StatusSuccess, rec.Claim.Status)
	require.NotZero(t, rec.CommandSeq)
	require.Len(t, callEntries(t, e, protocol.ToolCommandSubject("v1", project, channel, "wire"), fast), 1)
}

// TestApprovalExpiresAfterARestart: a held call whose ledger stopped
// before its expiry is expired by the keeper of the next one.
func TestApprovalExpiresAfterARestart(t *testing.T) {
	e := newEnv(t)
	l1, err := ledger.Open(ctxT(t), e.srv.Connect(t), ledger.Config{})
	require.NoError(t, err)
	_, err = l1.SetRoster(ctxT(t), protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	registerGated(t, l1, "wire", 1000, "")
	k, err := l1.StartApprovalKeeper(ctxT(t), ledger.ApprovalKeeperConfig{AckWait: 2 * time.Second})
	require.NoError(t, err)
	c, req := deadlineCall("turn-x", "c1", "wire", 0)
	_, err = l1.Dispatch(ctxT(t), req)
	require.NoError(t, err)
	require.NoError(t, k.Stop(ctxT(t)))
	l1.Close()

	l2, _ := openLedger(t, e.srv)
	startApprovalKeeper(t, l2, 100*time.Millisecond)
	requireEndedBy(t, e, l2, c, protocol.StatusFailed, protocol.ErrorCodeBadRequest, protocol.TaxonomyApprovalExpired)
}

// TestApprovalAuthApproverActsOnlyAsItself: an approver credential decides
// under its own name only, in its own project only, and does nothing else
// (NATS refuses the rest); the decision records it as the approver.
func TestApprovalAuthApproverActsOnlyAsItself(t *testing.T) {
	e := newAuthEnv(t)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	registerGated(t, e.l, "wire", 3_600_000, ", approvers: [alice]")
	c, req := deadlineCall("turn-auth", "c1", "wire", 0)
	_, err = e.l.Dispatch(ctx, req)
	require.NoError(t, err)
	body, err := json.Marshal(approvalOf(c))
	require.NoError(t, err)

	alice := e.client(t, auth.Grant{Role: auth.RoleApprover, Project: project, Approver: "alice"})
	e.refusedByNATS(t, alice, protocol.APISubject(project, "bob", protocol.OpApprove), nil, string(body))
	e.refusedByNATS(t, alice, protocol.APISubject("other", "alice", protocol.OpApprove), nil, string(body))
	e.refusedByNATS(t, alice, protocol.APISubject(project, "alice", protocol.OpDispatch), nil, `{}`)
	e.refusedByNATS(t, alice, protocol.APISubject(project, "alice", protocol.OpCallGet), nil, `{}`)
	sub, err := alice.nc.SubscribeSync("cg.v1." + project + ".>")
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, alice.nc.Flush())
	alice.denied(t, "cg.v1."+project+".>")

	// Its own subject, another project in the body: the ledger refuses.
	foreign := strings.Replace(string(body), `"project_id":"`+project+`"`, `"project_id":"other"`, 1)
	r := alice.request(t, protocol.APISubject(project, "alice", protocol.OpApprove), nil, foreign)
	require.Equal(t, "forbidden", r.Error.Code)
	// Bob, an approver the tool does not list, through his own subject.
	bob := e.client(t, auth.Grant{Role: auth.RoleApprover, Project: project, Approver: "bob"})
	r = bob.request(t, protocol.APISubject(project, "bob", protocol.OpApprove), nil, string(body))
	require.Equal(t, "forbidden", r.Error.Code)
	require.Equal(t, "approver", r.Error.Violations[0].Field)

	r = alice.request(t, protocol.APISubject(project, "alice", protocol.OpApprove), nil, string(body))
	require.True(t, r.OK, "%+v", r.Error)
	var out protocol.ApprovalResult
	require.NoError(t, json.Unmarshal(r.Result, &out))
	require.NotZero(t, out.CommandSeq)
	dec := e.subjectEntries(t, protocol.ApprovalSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, dec, 1)
	require.Equal(t, "alice", dec[0].Header.Get(protocol.HeaderActor))
	var ae protocol.ApprovalEntry
	require.NoError(t, json.Unmarshal(dec[0].Data, &ae))
	require.Equal(t, "alice", ae.Approver)
}

// TestApprovalDeadlineCountsFromTheDecision: a held call has no deadline
// while it waits (the deadline keeper does not time it out, however long
// past its budget); once approved its deadline is the decision plus the
// budget, which the deadline keeper then keeps. A read of the call (as an
// executor taking the command makes) finishes an approval cut after its
// command.
func TestApprovalDeadlineCountsFromTheDecision(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerGated(t, l, "wire", 3_600_000, "")
	startKeeper(t, l, 5*time.Second)
	c, req := deadlineCall("turn-dl", "c1", "wire", 1000)
	_, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	dispatched := time.Now()
	// Wait out the budget while held.
	<-time.After(1500 * time.Millisecond)
	rec, err := l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateAwaitingApproval, rec.State, "not timed out while held")

	crash := errors.New("killed")
	l.SetAfterStep(func(s ledger.Step) error {
		if s == ledger.StepApprovalCommand {
			return crash
		}
		return nil
	})
	_, err = l.Approve(ctx, "alice", approvalOf(c))
	require.ErrorIs(t, err, crash)
	l.SetAfterStep(func(ledger.Step) error { return nil })
	rec, err = l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State, "the read finished the approval")
	dup, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, rec.CommandSeq, dup.CommandSeq, "a repeated dispatch answers the released command")
	require.Equal(t, rec.DeadlineUnixMS, dup.DeadlineUnixMS)
	require.Greater(t, rec.DeadlineUnixMS, dispatched.Add(1500*time.Millisecond).UnixMilli())

	requireLedgerTimeout(t, e, l, c)
	dec := e.subjectEntries(t, protocol.ApprovalSubject("v1", project, channel, c.turn, c.id))
	var ae protocol.ApprovalEntry
	require.NoError(t, json.Unmarshal(dec[0].Data, &ae))
	require.Equal(t, ae.DecidedUnixMS+1000, rec.DeadlineUnixMS)
}

// TestApprovalIsRefusedPastTheExpiry: an approval or cancel arriving after
// expires_unix_ms, before any keeper ran, finds the call expired (the
// ledger stores the expiry then): no decision is later than the expiry.
func TestApprovalIsRefusedPastTheExpiry(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerGated(t, l, "wire", 1000, "")
	for _, op := range []string{"approve", "cancel"} {
		c, req := deadlineCall("turn-late-"+op, "c1", "wire", 0)
		res, err := l.Dispatch(ctx, req)
		require.NoError(t, err)
		<-time.After(time.Until(time.UnixMilli(res.ApprovalExpiresUnixMS)))
		if op == "approve" {
			_, err = l.Approve(ctx, "alice", approvalOf(c))
		} else {
			_, err = l.Cancel(ctx, protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id})
		}
		ref := requireRefusal(t, err, protocol.CodeConflict)
		want := "already has a report (failed)"
		if op == "approve" {
			want = "expired by " + protocol.ApprovalExpirySource
		}
		require.Contains(t, ref.Violations[0].Message, want)
		requireEndedBy(t, e, l, c, protocol.StatusFailed, protocol.ErrorCodeBadRequest, protocol.TaxonomyApprovalExpired)
	}
	require.Equal(t, float64(2), counterSum(t, reg, "cgledger_approvals_total"))
}

// TestApprovalDeciderAlonePublishesWithinItsLease: approvers racing on two
// ledgers (with the default lease) and reads of the call while the winner
// releases it publish the command once, so a core NATS subscriber of the
// tool's subject receives it once (the stream would absorb a second publish
// by its message id, but core subscribers would not); a read within the
// lease sees the call dispatched, with the deadline the decision fixed.
func TestApprovalDeciderAlonePublishesWithinItsLease(t *testing.T) {
	e := newEnv(t)
	open := func() *ledger.Ledger {
		l, err := ledger.Open(ctxT(t), e.srv.Connect(t), ledger.Config{Registerer: prometheus.NewRegistry(), DeadlineGrace: -1})
		require.NoError(t, err)
		t.Cleanup(l.Close)
		return l
	}
	l1, l2 := open(), open()
	ctx := ctxT(t)
	_, err := l1.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	registerGated(t, l1, "wire", 3_600_000, "")
	nc := e.srv.Connect(t)
	var mu sync.Mutex
	seen := map[string]int{}
	sub, err := nc.Subscribe(protocol.ToolCommandSubject("v1", project, channel, "wire"), func(m *nats.Msg) {
		mu.Lock()
		seen[m.Header.Get(protocol.HeaderToolCallID)]++
		mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())

	const calls = 6
	for i := range calls {
		c, req := deadlineCall("turn-lease", fmt.Sprintf("c%d", i), "wire", 0)
		_, err := l1.Dispatch(ctx, req)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for g, l := range []*ledger.Ledger{l1, l2, l1, l2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if g >= 2 {
					rec, err := l.GetCall(ctx, project, c.turn, c.id)
					require.NoError(t, err)
					require.Contains(t, []string{protocol.StateAwaitingApproval, protocol.StateDispatched}, rec.State)
					return
				}
				_, err := l.Approve(ctx, fmt.Sprintf("approver-%d", g), approvalOf(c))
				if e, refused := protocol.AsError(err); refused {
					require.Equal(t, protocol.CodeConflict, e.Code, "%v", e)
					return
				}
				require.NoError(t, err)
			}()
		}
		wg.Wait()
		rec, err := l2.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, protocol.StateDispatched, rec.State)
		require.NotZero(t, rec.DeadlineUnixMS)
	}
	require.NoError(t, nc.Flush())
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == calls
	}, time.Minute, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for id, n := range seen {
		require.Equal(t, 1, n, "call %s: its command reached core subscribers %d times", id, n)
	}
}
