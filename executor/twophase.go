package executor

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// Preparer is implemented by a tool that commits in two phases (seed 004,
// 6.3; docs/side-effects.md). The executor calls Prepare instead of Run:
// with a non-nil *Prepared it records the prepare (the ledger wakes the
// worker with the token) and the call waits for its decision; with nil, o
// is the call's outcome, as Run's. The worker's commit calls Commit, its
// abort or the ledger's abort at the commit deadline calls Rollback; the
// Outcome either returns is the call's final result, reported once.
//
// A decision is delivered at least once: an executor that dies while
// running Commit or Rollback leaves it to be delivered again (to another
// executor), so both must be idempotent for a token (a second Commit of a
// committed token answers the same outcome, without a second effect).
type Preparer interface {
	Prepare(ctx context.Context, call *Call) (p *Prepared, o Outcome)
	Commit(ctx context.Context, call *Call, token string) Outcome
	Rollback(ctx context.Context, call *Call, token string) Outcome
}

// Prepared is phase 1's answer: the token the worker commits with, and when
// the ledger aborts the call if nobody decided (zero, or later than the
// call's deadline: the call's deadline).
type Prepared struct {
	Token          string
	CommitDeadline time.Time
}

// CodePrepareRefused is the taxonomy code of a call whose tool prepared it
// and whose prepare the ledger refused (its commit deadline was past, say):
// the executor rolled it back.
const CodePrepareRefused = "S-TOOL-PREPARE-REFUSED"

// prepared reports whether the call is already prepared (a redelivery after
// its prepare was recorded): its decision comes on the tool's subject. A
// prepare not yet decided is repeated, which publishes the worker's wakeup
// if the first one's answer (and maybe its wakeup) was lost.
func (e *Executor) prepared(call *Call) (bool, error) {
	ctx, cancel := e.opCtx()
	defer cancel()
	tp, err := e.l.TwoPhase(ctx, call.ProjectID, call.AgentTurnID, call.ToolCallID)
	if err != nil || tp == nil {
		return false, err
	}
	if tp.State == protocol.PhasePrepared {
		_, err := e.l.Prepare(ctx, protocol.PrepareRequest{ProjectID: call.ProjectID, AgentTurnID: call.AgentTurnID, ToolCallID: call.ToolCallID,
			CommitToken: tp.CommitToken, CommitDeadlineUnixMS: tp.CommitDeadlineUnixMS})
		if _, refused := protocol.AsError(err); err != nil && !refused {
			return true, err
		}
	}
	return true, nil
}

// runPrepare is phase 1 of a Preparer's call: Prepare, then the prepare
// recorded, then the command acked with no report (the decision brings it).
func (e *Executor) runPrepare(ctx context.Context, msg jetstream.Msg, pr Preparer, call *Call, ans *answer, secrets []string, start time.Time) {
	p, o := pr.Prepare(ctx, call)
	if errors.Is(context.Cause(e.runCtx), errShutdown) {
		if p != nil {
			e.rollback(pr, call, p.Token)
		}
		_ = msg.Nak()
		return
	}
	if p == nil {
		e.finish(msg, ans, checkResult(call, o), 1, secrets, start)
		return
	}
	cd := p.CommitDeadline
	if cd.IsZero() || cd.After(call.Deadline) {
		cd = call.Deadline
	}
	octx, cancel := e.opCtx()
	_, err := e.l.Prepare(octx, protocol.PrepareRequest{ProjectID: call.ProjectID, AgentTurnID: call.AgentTurnID, ToolCallID: call.ToolCallID,
		CommitToken: p.Token, CommitDeadlineUnixMS: cd.UnixMilli()})
	cancel()
	le, refused := protocol.AsError(err)
	switch {
	case err == nil:
		e.ack(msg, "prepared")
	case refused && le.Code == protocol.CodeConflict:
		// Prepared (or answered) by someone else: that one decides.
		e.rollback(pr, call, p.Token)
		e.ack(msg, "prepare refused: "+le.Message)
	case refused:
		e.rollback(pr, call, p.Token)
		e.finish(msg, ans, Terminal(CodePrepareRefused, "the ledger refused the tool's prepare: "+le.Error(), "prepare with a commit deadline before the call's deadline"), 1, secrets, start)
	default:
		// Maybe recorded (the answer was lost): no rollback, since the
		// ledger may hold the token. The redelivery finds the prepare on
		// record (and repeats it, for the wakeup), or prepares again.
		e.retryLater(msg, "record the prepare", err)
	}
}

// rollback releases a prepare the ledger never recorded, best effort.
func (e *Executor) rollback(pr Preparer, call *Call, token string) {
	ctx, cancel := e.opCtx()
	defer cancel()
	_ = pr.Rollback(ctx, call, token)
}

// decide is phase 2: a decision entry delivered on the tool's subject runs
// Commit or Rollback and reports the outcome as the call's result. A
// decision whose call is answered (a redelivery after the report) only
// finishes that report; one the ledger's record does not show (not the
// call's stored decision) is acked and logged, never run.
func (e *Executor) decide(im *impl, msg jetstream.Msg, start time.Time, ackWait time.Duration) {
	var d protocol.DecisionEntry
	meta, merr := msg.Metadata()
	if err := json.Unmarshal(msg.Data(), &d); err != nil || merr != nil {
		e.log.Warn("decision that does not decode", "subject", msg.Subject(), "err", errors.Join(err, merr))
		e.ack(msg, "undecodable decision")
		return
	}
	pr, ok := im.tool.(Preparer)
	if !ok {
		e.log.Warn("decision for a tool that does not prepare", "tool", im.name, "call", d.ToolCallID)
		e.ack(msg, "not a Preparer")
		return
	}
	ctx, cancel := e.opCtx()
	rec, err := e.l.GetCall(ctx, d.ProjectID, d.AgentTurnID, d.ToolCallID)
	cancel()
	switch {
	case errors.Is(err, protocol.ErrUnknownCall):
		e.ack(msg, "decision of an unknown call")
		return
	case err != nil:
		e.retryLater(msg, "read call record", err)
		return
	case rec.State == protocol.StateClaimed:
		ctx, cancel := e.opCtx()
		_, err := e.l.Resume(ctx, rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)
		cancel()
		if _, refused := protocol.AsError(err); err != nil && !refused {
			e.retryLater(msg, "resume stored report", err)
			return
		}
		e.ack(msg, "resumed")
		return
	case rec.State != protocol.StateDispatched:
		e.ack(msg, "already answered")
		return
	}
	ctx, cancel = e.opCtx()
	tp, err := e.l.TwoPhase(ctx, d.ProjectID, d.AgentTurnID, d.ToolCallID)
	cancel()
	if err != nil {
		e.retryLater(msg, "read two-phase state", err)
		return
	}
	if tp == nil || tp.DecisionSeq != meta.Sequence.Stream || tp.CommitToken != d.CommitToken {
		e.log.Warn("decision not on the ledger's record: ignored", "tool", im.name, "call", d.ToolCallID, "seq", meta.Sequence.Stream)
		e.ack(msg, "decision not on record")
		return
	}
	call := &Call{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch,
		ToolCallID: rec.ToolCallID, StepID: rec.StepID, ToolName: rec.ToolName, Attempt: int(meta.NumDelivered),
		IdempotencyKey: protocol.IdempotencyKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID), Deadline: rec.Deadline()}
	if call.ToolName == "" {
		call.ToolName = im.name
	}
	rctx, stop := context.WithCancelCause(e.runCtx)
	defer stop(nil)
	if !call.Deadline.IsZero() {
		var dcancel context.CancelFunc
		rctx, dcancel = context.WithDeadline(rctx, call.Deadline)
		defer dcancel()
	}
	hbDone := make(chan struct{})
	go e.heartbeat(msg, ackWait, hbDone)
	defer close(hbDone)
	var o Outcome
	if d.Decision == protocol.DecisionCommit {
		o = pr.Commit(rctx, call, d.CommitToken)
	} else {
		o = pr.Rollback(rctx, call, d.CommitToken)
	}
	if errors.Is(context.Cause(e.runCtx), errShutdown) {
		_ = msg.Nak()
		return
	}
	ans := &answer{rec: rec, toolName: call.ToolName, delivery: meta.NumDelivered, trace: rctx, phase: d.Decision}
	e.finish(msg, ans, o, int(meta.NumDelivered), nil, start)
}
