package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/protocol"
)

// DefaultDeadlineGrace is Config.DeadlineGrace's default.
const DefaultDeadlineGrace = 5 * time.Second

// pastDeadline reports whether the ledger may record rec's timeout at now:
// its deadline plus the grace has passed. A record of an earlier version,
// DeadlineGrace is how long after a call's deadline this ledger records its
// timeout (Config.DeadlineGrace, or its default): until then a report is
// still accepted.
func (l *Ledger) DeadlineGrace() time.Duration { return l.grace }

// without a deadline, never is here (the deadline keeper computes one).
func (l *Ledger) pastDeadline(rec *protocol.CallRecord, now time.Time) bool {
	return rec.DeadlineUnixMS > 0 && !now.Before(rec.Deadline().Add(l.grace))
}

// timeoutCardID is the id of the result card of the ledger's timeout of a
// call: one per call, so every process recording it writes the same card.
func timeoutCardID(rec *protocol.CallRecord) string {
	h := sha256.Sum256([]byte(rec.ProjectID + "\x00" + rec.AgentTurnID + "\x00" + rec.ToolCallID))
	return "res-deadline-" + hex.EncodeToString(h[:16])
}

// deadlineFunction is the source_function (and the card's function_name)
// of the ledger's timeout: the call's tool, as a tool's own report names it.
func deadlineFunction(rec *protocol.CallRecord) string {
	if protocol.ValidIdentifier(rec.ToolName) {
		return rec.ToolName
	}
	return "deadline"
}

// timeoutContent is the tool.result content of the ledger's timeout, in
// the executor's shape (status, result, error with its detail). It depends
// on the record only, so any process writes the same bytes.
//
// With an attempt of a side_effectful tool on record (attempt > 0) the call
// did not merely run out of time: the tool may have had its effect, and
// nobody reported whether. That is failed, S-TOOL-OUTCOME-UNKNOWN, as when
// an executor finds an attempt open without a reconcile; never a timeout,
// which a worker may read as "safe to call again".
func timeoutContent(rec *protocol.CallRecord, deadline time.Time, attempt uint64) (json.RawMessage, error) {
	msg := fmt.Sprintf("no report was accepted by the call's deadline %s (fixed at dispatch); the ledger recorded the timeout", protocol.FormatTime(deadline))
	type detail struct {
		TaxonomyCode string `json:"taxonomy_code"`
		Class        string `json:"class"`
		FixHint      string `json:"fix_hint"`
		Attempts     int    `json:"attempts"`
		DeadlineMS   int64  `json:"deadline_unix_ms"`
	}
	type errBody struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Detail  detail `json:"detail"`
	}
	c := struct {
		Status string            `json:"status"`
		Result map[string]string `json:"result"`
		Error  errBody           `json:"error"`
	}{
		Status: protocol.StatusTimeout,
		Result: map[string]string{"error_code": protocol.ErrorCodeToolTimeout, "error_message": msg},
		Error: errBody{Code: protocol.ErrorCodeToolTimeout, Message: msg, Detail: detail{
			TaxonomyCode: protocol.TaxonomyDeadlineTimeout, Class: "retryable_error", Attempts: 0, DeadlineMS: deadline.UnixMilli(),
			FixHint: "check that a tool service is running for the tool and reporting in time, or raise the call's timeout_ms (up to the tool's timeout_ms_max)",
		}},
	}
	if attempt > 0 {
		msg = fmt.Sprintf("attempt %d of side_effectful tool %s started and no outcome was reported by the call's deadline %s: whether it took effect is unknown", attempt, rec.ToolName, protocol.FormatTime(deadline))
		c.Status = protocol.StatusFailed
		c.Result = map[string]string{"error_code": protocol.ErrorCodeInternal, "error_message": msg}
		c.Error = errBody{Code: protocol.ErrorCodeInternal, Message: msg, Detail: detail{
			TaxonomyCode: protocol.CodeToolOutcomeUnknown, Class: "terminal_error", Attempts: int(attempt), DeadlineMS: deadline.UnixMilli(),
			FixHint: "check with the tool's upstream, using the call's idempotency key, whether the effect happened; the call is never run again by itself",
		}}
	}
	return json.Marshal(c)
}

// recordTimeout ends a call that reached its deadline with no accepted
// report: a tool.result card of the ledger's, then a report through the
// report path's claim (so of the timeout and any racing report exactly one
// is stored, across processes), which wakes the worker; then a cancel, so a
// tool still running stops. A refusal with code conflict means a report
// won. Duplicate in the outcome means another process (or an earlier try)
// recorded it.
func (l *Ledger) recordTimeout(ctx context.Context, rec *protocol.CallRecord) (protocol.ReportOutcome, error) {
	// The ledger's own entries, also when a late report's request records
	// them: no caller's actor on them, no caller check.
	deadline := rec.Deadline()
	if deadline.IsZero() {
		return protocol.ReportOutcome{}, fmt.Errorf("timeout of %s/%s: the call record has no deadline", rec.AgentTurnID, rec.ToolCallID)
	}
	// The bucket does not say whether the call is reported (the wakeup is
	// the mark, issue 30): a report stored by anyone but the deadline wins
	// here, before the timeout's card is written for nothing.
	if view, err := l.streamView(ctx, rec, false); err != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("timeout of %s/%s: %w", rec.AgentTurnID, rec.ToolCallID, err)
	} else if view.Claim != nil && view.State != rec.State && view.Claim.SourceID != protocol.DeadlineSourceID {
		var vs protocol.Violations
		vs.Add("payload", protocol.VConflict, "call %s was already reported by %s: status %s (seq %d)", rec.ToolCallID, view.Claim.SourceID, view.Claim.Status, view.Claim.Seq)
		return protocol.ReportOutcome{}, protocol.NewError(protocol.CodeConflict, vs, "call %s already has a report", rec.ToolCallID)
	}
	// An attempt on record is read only here, on the deadline's path: the
	// hot path of a call reported in time never pays for it.
	var attempt uint64
	_, open, err := l.lastAttempt(ctx, protocol.AttemptSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("timeout of %s/%s: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	status, outcome := protocol.StatusTimeout, ""
	if open != nil {
		attempt, status, outcome = open.Attempt, protocol.StatusFailed, protocol.AttemptOutcomeUnknown
	}
	content, err := timeoutContent(rec, deadline, attempt)
	if err != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("timeout of %s/%s: encode result: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	fn := deadlineFunction(rec)
	card := &protocol.Card{
		CardID: timeoutCardID(rec), ProjectID: rec.ProjectID, Type: protocol.CardToolResult,
		AuthorID: protocol.DeadlineSourceID, FunctionName: fn, AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID,
		Content: content, Metadata: rec.CardMetadata,
	}
	raw := func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", nil, content) }
	if _, err := l.putCard(ctx, nil, protocol.OpReport, card, nil, rec.ChannelID, raw); err != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("timeout of %s/%s: result card: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	in := &reportInput{
		project: rec.ProjectID, channel: rec.ChannelID, sourceID: protocol.DeadlineSourceID, sourceFunction: fn,
		id:       protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, StepID: rec.StepID},
		payload:  protocol.ReportPayload{Status: status, AfterExecution: rec.AfterExecution, ToolResultCardID: card.CardID, StepID: rec.StepID, AttemptOutcome: outcome},
		stepID:   rec.StepID,
		deadline: true,
	}
	out, err := l.report(ctx, nil, in, raw)
	if err != nil {
		return out, err
	}
	if !out.Duplicate {
		l.m.timeouts.WithLabelValues(l.callToolLabel(rec)).Inc()
		l.log.Info("call timed out: no report by its deadline", "project", rec.ProjectID, "turn", rec.AgentTurnID, "call", rec.ToolCallID, "tool", rec.ToolName, "deadline", deadline, "seq", out.Seq)
	}
	if err := l.cancelAfterTimeout(ctx, rec); err != nil {
		return out, fmt.Errorf("timeout of %s/%s: cancel: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	return out, nil
}

// cancelAfterTimeout stores the cancel that tells a tool still running a
// timed-out call to stop. It follows the ledger's own timeout report, so,
// unlike a worker's cancel, it does not expect the call to be unreported;
// one per call, as for any cancel.
func (l *Ledger) cancelAfterTimeout(ctx context.Context, rec *protocol.CallRecord) error {
	subj := protocol.CancelSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	if prev, err := l.lastForSubject(ctx, subj); err != nil || prev != nil {
		return err
	}
	data, err := json.Marshal(protocol.CancelEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID,
		AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID, Reason: protocol.DeadlineCancelReason})
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: subj, Data: data, Header: protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID}.Header()}
	msg.Header.Set(protocol.HeaderProjectID, rec.ProjectID)
	msg.Header.Set(protocol.HeaderChannelID, rec.ChannelID)
	msg.Header.Set(protocol.HeaderMsgID, "cancel."+rec.ProjectID+"."+rec.AgentTurnID+"."+rec.ToolCallID)
	_, err = l.appendEntry(ctx, nil, protocol.KindCancel, msg)
	return err
}
