package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// answer is everything needed to write a call's result card and report.
type answer struct {
	rec      *protocol.CallRecord
	toolName string
	// attemptOutcome is the report's attempt_outcome: set when the call is
	// answered by resolving an attempt left open by a crash.
	attemptOutcome string
	delivery       uint64
	trace          context.Context
	// progress is the call's recorded progress (Call.Progress), nil until
	// the call is prepared.
	progress *progressLog
	// phase is the two-phase decision (commit, abort) this answer follows;
	// its result card id differs from the command's deliveries'.
	phase string
}

func (e *Executor) process(im *impl, msg jetstream.Msg, ackWait time.Duration) {
	start := time.Now()
	meta, err := msg.Metadata()
	if err != nil {
		e.log.Error("command without metadata", "err", err)
		_ = msg.Term()
		return
	}
	if meta.NumDelivered > 1 {
		e.m.redelivered.WithLabelValues(im.name).Inc()
	}
	h := msg.Headers()
	if protocol.HeaderGet(h, protocol.HeaderEntryKind) == string(protocol.KindDecision) {
		// Phase 2 of a prepared call: its decision, on the tool's subject.
		e.decide(im, msg, start, ackWait)
		return
	}
	cmd, perr := protocol.ParseToolCommand(msg.Subject(), h, msg.Data())
	if perr != nil {
		e.badCommand(msg, perr)
		return
	}
	sub, id := cmd.Subject, cmd.Identity
	if !e.handle(callKey(sub.Project, id.AgentTurnID, id.ToolCallID), meta.Sequence.Stream) {
		// Another message of the same call (a dispatch's command published
		// twice, a conformance copy) while this process handles the first:
		// that one answers the call, and stays unacknowledged until it has,
		// so acknowledging this copy loses nothing.
		e.ack(msg, "a copy of a command this process is handling")
		return
	}
	defer e.handled(callKey(sub.Project, id.AgentTurnID, id.ToolCallID), meta.Sequence.Stream)
	pre := e.prefetch(cmd, meta.NumDelivered > 1)
	rec, err := pre.rec, pre.recErr
	switch {
	case errors.Is(err, protocol.ErrUnknownCall):
		var vs protocol.Violations
		vs.Add("header."+protocol.HeaderToolCallID, protocol.VNotFound, "call %s of turn %s was not dispatched through the ledger", id.ToolCallID, id.AgentTurnID)
		e.reject(msg, &protocol.Error{Code: protocol.CodeUnknownCall, Message: "command for a call the ledger never dispatched", Violations: vs})
		return
	case err != nil:
		e.retryLater(msg, "read call record", err)
		return
	case rec.State == protocol.StateClaimed || (rec.State == protocol.StateDispatched && meta.NumDelivered > 1):
		// A redelivery: a report may be stored whose reporter died before
		// waking the agent. Finish it (idempotent) rather than run the tool
		// again; only a call with no stored report runs.
		ctx, cancel := e.opCtx()
		_, err := e.l.Resume(ctx, sub.Project, id.AgentTurnID, id.ToolCallID)
		cancel()
		if errors.Is(err, protocol.ErrNotReported) && rec.State == protocol.StateDispatched {
			break
		}
		if _, refused := protocol.AsError(err); err != nil && !refused {
			e.retryLater(msg, "resume stored report", err)
			return
		}
		e.ack(msg, "resumed")
		return
	case rec.State != protocol.StateDispatched:
		// Already answered (a redelivery after the report, or a repeated
		// command): nothing to run.
		e.ack(msg, "already answered")
		return
	}

	key := callKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)
	runCtx, stop := context.WithCancelCause(e.runCtx)
	defer stop(nil)
	e.mu.Lock()
	e.inflight[key] = stop
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.inflight, key)
		e.mu.Unlock()
	}()

	spanCtx, span := startSpan(runCtx, e.tp, h, "cgledger.tool "+rec.ToolName)
	defer span.End()
	ans := &answer{rec: rec, toolName: rec.ToolName, delivery: meta.NumDelivered, trace: spanCtx}
	if ans.toolName == "" {
		ans.toolName = im.name
	}

	if int(meta.NumDelivered) >= e.cfg.MaxDeliver {
		o := Terminal(CodeRedelivered, fmt.Sprintf("the command was delivered %d times without an outcome (executor crashes or timeouts)", meta.NumDelivered), "look for executor crashes while running this tool")
		e.finishChecked(msg, ans, pre.cancel, o, 0, nil, start)
		return
	}
	call, schema, secrets, bad, err := e.prepare(im, cmd, pre)
	if err != nil {
		if !e.stopIfCanceled(msg, ans, pre.cancel, start) {
			e.retryLater(msg, "prepare call", err)
		}
		return
	}
	if call != nil {
		ans.toolName = call.ToolName
		call.progress = newProgressLog(func() { _ = msg.InProgress() })
		ans.progress = call.progress
	}
	if bad != nil {
		e.finishChecked(msg, ans, pre.cancel, *bad, 0, secrets, start)
		return
	}
	if vs := validateArgs(schema, call.Arguments); len(vs) > 0 {
		e.finishChecked(msg, ans, pre.cancel, Invalid("arguments do not match the tool's parameters schema", vs...), 0, secrets, start)
		return
	}

	deadline, budget := e.deadline(call.Definition, cmd, rec)
	call.Deadline, call.Timeout = deadline, budget
	if !time.Now().Before(deadline) {
		// Picked up after its deadline (a queue, a crash): never started.
		if e.stopIfCanceled(msg, ans, pre.cancel, start) {
			return
		}
		e.m.deadlines.WithLabelValues(e.labels.Label(call.ToolName)).Inc()
		e.finish(msg, ans, timeoutOutcome(call), 0, secrets, start)
		return
	}
	dctx, dcancel := context.WithDeadline(runCtx, deadline)
	defer dcancel()
	hbDone := make(chan struct{})
	go e.heartbeat(msg, ackWait, hbDone)
	defer close(hbDone)

	pr, twoPhase := im.tool.(Preparer)
	// A pure tool runs while its cancellation is read (one round trip
	// less before the run): running it changes nothing, and the answer
	// waits for the read, so a cancel recorded before the delivery still
	// decides the outcome. Any other tool may have an effect: it runs only
	// once the read says it was not canceled.
	if call.Definition.Determinism != protocol.DeterminismPure || twoPhase || meta.NumDelivered > 1 {
		if e.stopIfCanceled(msg, ans, pre.cancel, start) {
			return
		}
	}
	if twoPhase {
		// A redelivery after the prepare was recorded: the decision comes
		// on the tool's subject, and phase 1 never runs again.
		done, err := e.prepared(call)
		if err != nil {
			e.retryLater(msg, "read two-phase state", err)
			return
		}
		if done {
			e.ack(msg, "already prepared")
			return
		}
	}
	if call.Definition.Determinism == protocol.DeterminismSideEffectful {
		// Intent before effect: the attempt is on record before the tool
		// runs, and an attempt already on record without an outcome is
		// resolved, never run again by itself.
		in := e.intent(dctx, im, call)
		switch {
		case errors.Is(context.Cause(runCtx), errShutdown):
			_ = msg.Nak()
			return
		case in.err != nil:
			e.retryLater(msg, "record or reconcile the attempt", in.err)
			return
		case !in.run:
			ans.attemptOutcome = in.attemptOutcome
			e.finish(msg, ans, in.outcome, 0, secrets, start)
			return
		}
	}
	if twoPhase {
		e.runPrepare(dctx, msg, pr, call, ans, secrets, start)
		return
	}
	o, attempts := e.run(dctx, im, call)
	if errors.Is(context.Cause(runCtx), errShutdown) {
		// Shutting down is not an outcome: let another executor run it.
		_ = msg.Nak()
		return
	}
	o = checkResult(call, o)
	e.finishChecked(msg, ans, pre.cancel, o, attempts, secrets, start)
}

// cancelRead is a call's cancellation, read from the ledger concurrently
// with the executor's other work; wait gives its answer.
type cancelRead struct {
	done     chan struct{}
	canceled bool
	err      error
}

// readCancel starts reading the cancellation of cmd's call.
func (e *Executor) readCancel(cmd *protocol.ToolCommand) *cancelRead {
	r := &cancelRead{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		ctx, cancel := e.opCtx()
		defer cancel()
		sub, id := cmd.Subject, cmd.Identity
		r.canceled, r.err = e.l.Canceled(ctx, sub.Project, sub.Channel, id.AgentTurnID, id.ToolCallID)
	}()
	return r
}

// wait returns the cancellation once read.
func (r *cancelRead) wait() (bool, error) {
	<-r.done
	return r.canceled, r.err
}

// stopIfCanceled waits for the cancellation and, when the call was
// canceled (answered canceled) or the read failed (left for a redelivery),
// reports true: the caller stops there.
func (e *Executor) stopIfCanceled(msg jetstream.Msg, ans *answer, cr *cancelRead, start time.Time) bool {
	canceled, err := cr.wait()
	if err != nil {
		e.retryLater(msg, "read cancellation", err)
		return true
	}
	if canceled {
		e.finish(msg, ans, canceledOutcome(), 0, nil, start)
		return true
	}
	return false
}

// finishChecked answers the call with o unless its cancellation, read
// concurrently, says it was canceled: a cancel recorded before the
// command's delivery decides the outcome whatever ran meanwhile.
func (e *Executor) finishChecked(msg jetstream.Msg, ans *answer, cr *cancelRead, o Outcome, attempts int, secrets []string, start time.Time) {
	if e.stopIfCanceled(msg, ans, cr, start) {
		return
	}
	e.finish(msg, ans, o, attempts, secrets, start)
}

// prefetched holds what running a command needs to read from the ledger,
// read concurrently: one round trip instead of four.
type prefetched struct {
	rec    *protocol.CallRecord
	recErr error
	// cancel is the cancellation, read concurrently (readCancel).
	cancel   *cancelRead
	card     *protocol.StoredCard
	cardErr  error
	toolName string // the tool read ahead (the payload's); "" when none
	tool     *protocol.StoredTool
	toolErr  error
}

// prefetch reads the call record, the cancellation, the tool.call card and
// the tool definition named by the payload at once. Reads a command turns
// out not to need (an unknown or finished call) cost nothing but the wait.
func (e *Executor) prefetch(cmd *protocol.ToolCommand, redelivered bool) *prefetched {
	ctx, cancel := e.opCtx()
	defer cancel()
	sub, id := cmd.Subject, cmd.Identity
	cr := e.readCancel(cmd)
	in := e.l.ReadExecutionInputs(ctx, protocol.ExecutionQuery{
		Project: sub.Project, Channel: sub.Channel, AgentTurnID: id.AgentTurnID, ToolCallID: id.ToolCallID,
		ToolCallCardID: cmd.Payload.ToolCallCardID, ToolName: cmd.Payload.ToolName, Fresh: redelivered, SkipCancel: true,
	})
	p := &prefetched{rec: in.Record, recErr: in.RecordErr, cancel: cr,
		card: in.Card, cardErr: in.CardErr, tool: in.Tool, toolErr: in.ToolErr}
	if protocol.ValidIdentifier(cmd.Payload.ToolName) {
		p.toolName = cmd.Payload.ToolName
	}
	return p
}

func canceledOutcome() Outcome {
	return Outcome{Kind: KindTerminal, Code: CodeCanceled, Message: "the call was canceled by its worker"}
}

// handle records that this process handles the command at stream sequence
// seq of call key; false when it already handles another command of it.
func (e *Executor) handle(key string, seq uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.handling[key]; ok && s != seq {
		return false
	}
	e.handling[key] = seq
	return true
}

// handled ends what handle began.
func (e *Executor) handled(key string, seq uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.handling[key] == seq {
		delete(e.handling, key)
	}
}
