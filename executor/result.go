package executor

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/cgledger/cgledger/protocol"
)

// resultCardID is deterministic per delivery: a redelivered command writes
// its own card rather than colliding with a card an earlier run may have
// written before crashing.
func resultCardID(key []byte, rec *protocol.CallRecord, delivery uint64) string {
	msg := []byte(rec.ProjectID + "\x00" + rec.AgentTurnID + "\x00" + rec.ToolCallID + "\x00" + strconv.FormatUint(delivery, 10))
	if len(key) == 0 {
		h := sha256.Sum256(msg)
		return "res-" + hex.EncodeToString(h[:16])
	}
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return "res-" + hex.EncodeToString(m.Sum(nil)[:16])
}

// finish writes the result card and reports it, then acks. A transient
// ledger failure naks for redelivery (the next delivery sees the report if
// it did land and stops there).
func (e *Executor) finish(msg jetstream.Msg, ans *answer, o Outcome, attempts int, secrets []string, start time.Time) {
	rec := ans.rec
	red := redactor(secrets)
	o.Message = red.str(o.Message)
	for i := range o.Violations {
		o.Violations[i].Message = red.str(o.Violations[i].Message)
	}
	reconciled := ans.attemptOutcome == protocol.AttemptReconciled
	o.progress = ans.progress.snapshot()
	content, status, err := resultContent(o, attempts, reconciled)
	if err != nil {
		o = Terminal(CodeToolPanic, "the tool's output cannot be encoded as JSON: "+err.Error(), "return JSON-encodable output")
		content, status, _ = resultContent(o, attempts, reconciled)
	}
	if status != protocol.StatusSuccess {
		// The tool's span says how the call ended, as the ledger's spans do.
		span := trace.SpanFromContext(ans.trace)
		span.SetAttributes(attribute.String("cgledger.code", o.Code), attribute.String("cgledger.status", status))
		span.SetStatus(codes.Error, status)
	}
	content = red.bytes(content)
	card := protocol.Card{
		CardID: resultCardID(e.cfg.CardIDKey, rec, ans.delivery), ProjectID: rec.ProjectID, Type: protocol.CardToolResult,
		AuthorID: e.cfg.SourceID, FunctionName: ans.toolName, AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID,
		Content: content, Metadata: rec.CardMetadata,
	}
	if ans.phase != "" {
		card.CardID += "-" + ans.phase
	}
	ctx, cancel := e.opCtx()
	defer cancel()
	traceparent, tracestate := injectTrace(ans.trace)
	id := protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID,
		StepID: rec.StepID, Traceparent: traceparent, Tracestate: tracestate}
	req := protocol.ReportRequest{
		ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, Identity: id, SourceID: e.cfg.SourceID, SourceFunction: ans.toolName,
		Payload: protocol.ReportPayload{Status: status, AfterExecution: rec.AfterExecution, ToolResultCardID: card.CardID, StepID: rec.StepID, AttemptOutcome: ans.attemptOutcome},
	}
	// One request for the card and the report (report.result): the ledger
	// checks both and stores them together, or neither.
	_, err = e.l.ReportResult(ctx, card, req)
	if le, refused := protocol.AsError(err); refused && le.Code == protocol.CodeBadRequest && cardRefused(le) {
		// The result itself is unacceptable (too large...): answer with
		// that instead, which always fits.
		msg := "the tool's result was refused by the ledger: " + le.Message
		// The refusal's count alone says nothing: name each problem (the
		// card's field, its size and the limit), as card.put names them.
		vs := make(protocol.Violations, 0, len(le.Violations))
		for _, v := range le.Violations {
			v.Field = strings.TrimPrefix(v.Field, "body.")
			vs = append(vs, v)
		}
		for i, v := range vs {
			sep := "; "
			if i == 0 {
				sep = ": "
			}
			msg += fmt.Sprintf("%s%s: %s (%s)", sep, v.Field, v.Message, v.Code)
		}
		o = Terminal("S-TOOL-RESULT", msg, "return a smaller result")
		o.Violations = vs
		content, status, _ = resultContent(o, attempts, reconciled)
		card.Content = content
		card.CardID += "-r"
		req.Payload.Status, req.Payload.ToolResultCardID = status, card.CardID
		_, err = e.l.ReportResult(ctx, card, req)
	}
	if err != nil {
		le, refused := protocol.AsError(err)
		if !refused || (le.Code == protocol.CodeConflict && len(le.Violations) > 0 && le.Violations[0].Field == "body.card.card_id") {
			// Not answered, or the card's id holds another card (as a
			// refused card.put was): the command is delivered again.
			e.retryLater(msg, "report result", err)
			return
		}
		// Refused (stale epoch, a different result already reported...):
		// the ledger recorded why; this command is answered.
		e.log.Warn("report refused", "tool", ans.toolName, "call", rec.ToolCallID, "err", err)
	}
	e.ack(msg, "reported")
	tool := e.labels.Label(ans.toolName)
	e.m.calls.WithLabelValues(tool, status, errorClass(o), e.labels.VersionLabel(ans.toolName, rec.ToolVersion)).Inc()
	e.m.duration.WithLabelValues(tool).Observe(time.Since(start).Seconds())
	e.log.Info("call resolved", "tool", ans.toolName, "call", rec.ToolCallID, "status", status, "code", o.Code, "attempts", attempts, "duration_ms", time.Since(start).Milliseconds())
}

// cardRefused says a report.result was refused for its card (its body, or
// a field of body.card): the result itself is what the ledger cannot take.
func cardRefused(le *protocol.Error) bool {
	for _, v := range le.Violations {
		if v.Field == "body" || v.Field == "body.card" || strings.HasPrefix(v.Field, "body.card.") {
			return true
		}
	}
	return false
}

// errorClass is the error_class label of an outcome: "none" on success,
// so that no series has an empty label (which PromQL cannot tell from an
// absent one).
func errorClass(o Outcome) string {
	if o.Kind == KindSuccess {
		return NoErrorClass
	}
	return class(o.Code)
}

// NoErrorClass is the error_class of cgledger_executor_calls_total for a
// call that succeeded.
const NoErrorClass = "none"

// retryLater naks with a delay so JetStream redelivers the command.
func (e *Executor) retryLater(msg jetstream.Msg, what string, err error) {
	delay := time.Second
	if meta, merr := msg.Metadata(); merr == nil {
		// Back off while the failure lasts (a full disk can last a while).
		delay = min(time.Duration(meta.NumDelivered)*time.Second, 30*time.Second)
	}
	e.log.Warn("transient failure; command will be redelivered", "step", what, "err", err, "retry_in", delay)
	e.m.retries.Inc()
	if e.runCtx.Err() != nil {
		_ = msg.Nak()
		return
	}
	_ = msg.NakWithDelay(delay)
}

// badCommand answers a command that does not validate: with a failed
// result through the report path when its identity routes to a dispatched
// call, else with a rejection entry. Either way it is acked.
func (e *Executor) badCommand(msg jetstream.Msg, perr error) {
	le, _ := protocol.AsError(perr)
	if le == nil {
		le = &protocol.Error{Code: protocol.CodeBadRequest, Message: perr.Error()}
	}
	sub, serr := protocol.ParseSubject(msg.Subject())
	id, idViolations := protocol.ParseIdentity(msg.Headers(), protocol.IdentityRules{RequireToolCallID: true})
	if serr == nil && sub.IsCommand() && len(idViolations) == 0 {
		ctx, cancel := e.opCtx()
		rec, err := e.l.GetCall(ctx, sub.Project, id.AgentTurnID, id.ToolCallID)
		cancel()
		if err == nil && rec.State == protocol.StateDispatched && rec.ChannelID == sub.Channel {
			meta, _ := msg.Metadata()
			ans := &answer{rec: rec, toolName: rec.ToolName, delivery: meta.NumDelivered, trace: e.runCtx}
			if ans.toolName == "" {
				ans.toolName = "unknown"
			}
			o := Outcome{Kind: KindInvalid, Code: CodeBadCommand, Message: "the tool command does not follow the protocol", Violations: le.Violations}
			e.finish(msg, ans, o, 0, nil, time.Now())
			return
		}
	}
	e.reject(msg, le)
}

func (e *Executor) reject(msg jetstream.Msg, le *protocol.Error) {
	ctx, cancel := e.opCtx()
	defer cancel()
	if err := e.l.RejectCommand(ctx, msg.Subject(), msg.Headers(), msg.Data(), le); err != nil {
		e.retryLater(msg, "record command rejection", err)
		return
	}
	e.m.rejected.WithLabelValues(string(le.Code)).Inc()
	e.ack(msg, "rejected")
}

// ack acknowledges a command whose answer is in the ledger. A failed ack
// only means a redelivery, which finds the call answered and acks again;
// it is logged so that a run of them (a lost connection) is seen.
func (e *Executor) ack(msg jetstream.Msg, why string) {
	if err := msg.Ack(); err != nil {
		e.log.Warn("ack command", "subject", msg.Subject(), "after", why, "err", err)
	}
}
