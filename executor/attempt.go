package executor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// heartbeat tells JetStream the command is still being worked on, so it is
// not redelivered to a second executor while this one is alive: every
// third of ackWait, the ack wait of the consumer msg came from.
func (e *Executor) heartbeat(msg jetstream.Msg, ackWait time.Duration, done <-chan struct{}) {
	t := time.NewTicker(ackWait / 3)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			_ = msg.InProgress()
		}
	}
}

// run runs attempts until an outcome is final: retries only retryable
// classes, with exponential backoff and full jitter (at least retry_after),
// never past the deadline.
func (e *Executor) run(ctx context.Context, im *impl, call *Call) (Outcome, int) {
	def := call.Definition
	sem := e.sem(call.ProjectID, def)
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return e.interrupted(ctx, call), 0
	}
	tool := e.labels.Label(call.ToolName)
	e.m.inFlight.WithLabelValues(tool).Inc()
	defer e.m.inFlight.WithLabelValues(tool).Dec()
	// A side_effectful call's attempt number is the ledger's (never
	// retried here, so it stays that number).
	first := max(call.Attempt, 1)
	for attempt := 1; ; attempt++ {
		call.Attempt = first + attempt - 1
		e.m.attempts.WithLabelValues(tool).Inc()
		o := e.attempt(ctx, im, call)
		if ctx.Err() != nil {
			return e.interrupted(ctx, call), attempt
		}
		if !retryable(o, def.Determinism, attempt) || attempt >= def.Retry.MaxAttempts {
			return o, attempt
		}
		wait := backoff(def.Retry, attempt)
		if o.RetryAfter > wait {
			wait = o.RetryAfter
		}
		if time.Now().Add(wait).After(call.Deadline) {
			return o, attempt
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return e.interrupted(ctx, call), attempt
		}
	}
}

// attempt runs the tool once, recovering panics, and stops waiting at the
// deadline even if the tool ignores its context.
func (e *Executor) attempt(ctx context.Context, im *impl, call *Call) Outcome {
	res := make(chan Outcome, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				e.log.Error("tool panicked", "tool", call.ToolName, "panic", fmt.Sprint(r))
				res <- Retryable(CodeToolPanic, fmt.Sprintf("tool panicked: %v", r), 0)
			}
		}()
		res <- im.tool.Run(ctx, call)
	}()
	select {
	case o := <-res:
		return o
	case <-ctx.Done():
		return Outcome{}
	}
}

// interrupted turns a done context into the call's outcome.
func (e *Executor) interrupted(ctx context.Context, call *Call) Outcome {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errWorkerCanceled) && time.Now().Before(call.Deadline):
		return canceledOutcome()
	case errors.Is(cause, errShutdown):
		return Outcome{Kind: KindTerminal, Code: "S-TOOL-SHUTDOWN", Message: "executor shutting down"}
	default:
		// A cancel past the deadline is the ledger's, sent with the
		// timeout it recorded: the call timed out.
		e.m.deadlines.WithLabelValues(e.labels.Label(call.ToolName)).Inc()
		return timeoutOutcome(call)
	}
}

// timeoutOutcome is the outcome of a call that reached its deadline.
func timeoutOutcome(call *Call) Outcome {
	return Retryable(CodeTimeout, fmt.Sprintf("the call did not finish within its deadline of %d ms from dispatch", call.Timeout.Milliseconds()), 0)
}

func backoff(p protocol.RetryPolicy, attempt int) time.Duration {
	capMS := float64(p.CapMS)
	exp := float64(p.BaseMS) * float64(uint64(1)<<min(attempt-1, 30))
	if exp > capMS {
		exp = capMS
	}
	return time.Duration(rand.Float64()*exp) * time.Millisecond
}

// intentResult is what recording a side_effectful call's attempt decided:
// run the tool (run), answer the call without running it (outcome, with
// the report's attemptOutcome), or try again later (err).
type intentResult struct {
	run            bool
	outcome        Outcome
	attemptOutcome string
	err            error
}

// maxReconcileRounds bounds one delivery's reconcile rounds: each is an
// open attempt found not done and the next one taken by someone else first,
// which only a race between executors does.
const maxReconcileRounds = 4

// intent records the call's attempt before its side_effectful tool runs
// (attempt.start). When an attempt is already on record without an outcome
// (its runner died between the effect and the report), it is resolved by
// the tool's Reconciler, else answered S-TOOL-OUTCOME-UNKNOWN: never run
// again by itself (docs/side-effects.md).
func (e *Executor) intent(ctx context.Context, im *impl, call *Call) intentResult {
	tool := e.labels.Label(call.ToolName)
	req := protocol.AttemptStartRequest{ProjectID: call.ProjectID, AgentTurnID: call.AgentTurnID, ToolCallID: call.ToolCallID,
		ExecutorID: e.cfg.SourceID, DeadlineUnixMS: call.Deadline.UnixMilli()}
	for range maxReconcileRounds {
		octx, cancel := e.opCtx()
		res, err := e.l.StartAttempt(octx, req)
		cancel()
		if err != nil {
			return intentResult{err: fmt.Errorf("attempt.start: %w", err)}
		}
		call.Attempt = int(res.Attempt)
		if res.Started {
			e.m.intents.WithLabelValues(tool, "started").Inc()
			return intentResult{run: true}
		}
		rc, ok := im.tool.(Reconciler)
		if !ok {
			e.m.intents.WithLabelValues(tool, protocol.AttemptOutcomeUnknown).Inc()
			o := Terminal(protocol.CodeToolOutcomeUnknown,
				fmt.Sprintf("attempt %d of this call started (by %s) and its outcome was lost: it may or may not have taken effect, and tool %s has no reconcile to find out", res.Attempt, res.ExecutorID, call.ToolName),
				fmt.Sprintf("check the effect upstream (idempotency key %s) before calling again; a tool with a reconcile (executor.Reconciler) resolves this by itself", res.IdempotencyKey))
			return intentResult{outcome: o, attemptOutcome: protocol.AttemptOutcomeUnknown}
		}
		done, o, err := e.reconcile(ctx, rc, call)
		if err != nil {
			return intentResult{err: fmt.Errorf("reconcile attempt %d: %w", res.Attempt, err)}
		}
		if done {
			e.m.intents.WithLabelValues(tool, protocol.AttemptReconciled).Inc()
			return intentResult{outcome: o, attemptOutcome: protocol.AttemptReconciled}
		}
		e.m.intents.WithLabelValues(tool, protocol.AttemptNotDone).Inc()
		req.NotDone = res.Attempt
	}
	return intentResult{err: fmt.Errorf("attempt of call %s still taken by others after %d reconcile rounds", call.ToolCallID, maxReconcileRounds)}
}

// reconcile asks the tool about an open attempt, recovering a panic as an
// error (asked again on the next delivery).
func (e *Executor) reconcile(ctx context.Context, rc Reconciler, call *Call) (done bool, o Outcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			e.log.Error("tool reconcile panicked", "tool", call.ToolName, "panic", fmt.Sprint(r))
			done, err = false, fmt.Errorf("reconcile panicked: %v", r)
		}
	}()
	return rc.Reconcile(ctx, call)
}
