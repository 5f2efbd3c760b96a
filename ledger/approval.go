package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// Approvals (docs/approvals.md). A held call has a record in state
// awaiting_approval and a held entry, and no command. Its one decision is
// the approval entry on the call's own subject (expect-last-subject-seq 0):
// whoever appends it first decides, and every later decider is told
// conflict. Everything after the decision (the command, or the result, its
// report and wakeup) is re-done idempotently by whoever finds it undone: a
// retried op, a report or cancel that meets the call, the approval keeper.

// holdTerms returns the terms of a call to hold for approval and the
// approval's timeout, or nil when the call is not held: the tool's
// definition requires approval, or the dispatch asked for it.
func holdTerms(registered *protocol.StoredTool, asked *protocol.DispatchApproval) (*protocol.HeldCall, int64) {
	var def *protocol.ToolApproval
	if registered != nil {
		def = registered.Definition.Approval
	}
	var by string
	switch {
	case def != nil && def.Required:
		by = protocol.ApprovalRequestedByDefinition
	case asked != nil && asked.Required:
		by = protocol.ApprovalRequestedByWorker
	default:
		return nil, 0
	}
	h := &protocol.HeldCall{RequestedBy: by}
	if def != nil {
		// The terms in force at dispatch bind the call, as its pinned
		// definition does: a later registration changes later calls.
		h.Approvers, h.AllowSelfApproval = slices.Clone(def.Approvers), def.AllowSelfApproval
	}
	return h, def.Timeout()
}

// storedArgumentsDigest is the digest of a tool.call card's arguments as
// the ledger stores the card (its JSON encoding, which an approver's
// approval.get shows and the digest is checked against).
func storedArgumentsDigest(cardBytes []byte) (string, error) {
	var c protocol.Card
	if err := json.Unmarshal(cardBytes, &c); err != nil {
		return "", fmt.Errorf("decode card: %w", err)
	}
	tc, err := c.ToolCall()
	if err != nil {
		return "", fmt.Errorf("card %s: %w", c.CardID, err)
	}
	return protocol.ArgumentsDigest(tc.Arguments), nil
}

// dispatchHeld finishes the dispatch of a held call (created: this
// dispatch created its record) or answers a repeated one: it stores the
// held entry once, and never the command, which only an approval
// publishes.
func (l *Ledger) dispatchHeld(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord, rev, cardSeq uint64, created bool) (protocol.DispatchResult, error) {
	res := protocol.DispatchResult{Subject: rec.Subject, ToolCallCardID: rec.ToolCallCardID, CardSeq: cardSeq, Duplicate: !created,
		ToolDefSeq: rec.ToolDefSeq, ToolVersion: rec.ToolVersion, ApprovalExpiresUnixMS: rec.Held.ExpiresUnixMS}
	if !created {
		l.m.dupDispatches.Inc()
		// An approval whose follow-up is unfinished is finished first, so
		// the repeat answers the released command.
		settled, err := l.settleHeld(ctx, rec)
		if err != nil {
			return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", rec.AgentTurnID, rec.ToolCallID, err)
		}
		if settled.CommandSeq != 0 {
			res.CommandSeq, res.DeadlineUnixMS = settled.CommandSeq, settled.DeadlineUnixMS
			return res, nil
		}
	}
	if rec.State != protocol.StateAwaitingApproval {
		// Decided and ended (denied, expired, canceled): its outcome is
		// the call's report; nothing more to publish.
		return res, nil
	}
	res.AwaitingApproval = true
	if rec.Held.HeldSeq != 0 {
		return res, nil
	}
	seq, err := l.ensureHeld(ctx, by, rec)
	if err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	if err := l.step(stepHeld); err != nil {
		return protocol.DispatchResult{}, err
	}
	key := callKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)
	if err := l.recordHeldSeq(ctx, key, rec, rev, seq, cardSeq); err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	return res, nil
}

// recordHeldSeq stores the held entry's and the card's sequences in the
// record, unless it moved on (a decision may be that fast).
func (l *Ledger) recordHeldSeq(ctx context.Context, key string, rec *protocol.CallRecord, rev, heldSeq, cardSeq uint64) error {
	cur := cloneRecord(rec)
	for range 16 {
		if cur.State != protocol.StateAwaitingApproval || cur.Held.HeldSeq != 0 {
			return nil
		}
		cur.Held.HeldSeq, cur.CardSeq = heldSeq, cardSeq
		_, ok, err := l.updateRecord(ctx, key, cur, rev)
		if err != nil || ok {
			return err
		}
		next, nrev, err := l.reread(ctx, key)
		if err != nil {
			return err
		}
		cur, rev = cloneRecord(next), nrev
	}
	return fmt.Errorf("call record %s: too many concurrent updates", key)
}

// approvalHeader is the CG-* header of the ledger's own entries about a call.
func approvalHeader(rec *protocol.CallRecord) nats.Header {
	h := protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, StepID: rec.StepID}.Header()
	h.Set(protocol.HeaderProjectID, rec.ProjectID)
	h.Set(protocol.HeaderChannelID, rec.ChannelID)
	return h
}

// ensureHeld returns the sequence of the call's held entry, appending it
// when a dispatch stopped before it did.
func (l *Ledger) ensureHeld(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord) (uint64, error) {
	if rec.Held.HeldSeq != 0 {
		return rec.Held.HeldSeq, nil
	}
	subj := protocol.HeldSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	if m, err := l.lastForSubject(ctx, subj); err != nil || m != nil {
		if err != nil {
			return 0, fmt.Errorf("held entry: %w", err)
		}
		return m.Sequence, nil
	}
	var cmdSubject string
	if sub, err := protocol.ParseSubject(rec.Subject); err == nil {
		cmdSubject = sub.String()
	}
	data, err := json.Marshal(protocol.HeldEntry{
		ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch,
		ToolCallID: rec.ToolCallID, StepID: rec.StepID, ToolName: rec.ToolName, ToolCallCardID: rec.ToolCallCardID,
		ArgumentsDigest: rec.Held.ArgumentsDigest, Reason: protocol.HeldForApproval, RequestedBy: rec.Held.RequestedBy,
		Approvers: rec.Held.Approvers, AllowSelfApproval: rec.Held.AllowSelfApproval, ExpiresUnixMS: rec.Held.ExpiresUnixMS,
		CommandSubject: cmdSubject, BudgetMS: rec.Held.BudgetMS,
	})
	if err != nil {
		return 0, fmt.Errorf("held entry: encode: %w", err)
	}
	msg := &nats.Msg{Subject: subj, Data: data, Header: approvalHeader(rec)}
	msg.Header.Set(protocol.HeaderMsgID, "held."+rec.ProjectID+"."+rec.AgentTurnID+"."+rec.ToolCallID)
	ack, err := l.appendEntry(ctx, by, protocol.KindHeld, msg, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case err == nil:
		return ack.Sequence, nil
	case isWrongLastSeq(err):
		m, err := l.storedEntry(ctx, subj)
		if err != nil {
			return 0, fmt.Errorf("held entry: %w", err)
		}
		return m.Sequence, nil
	default:
		return 0, fmt.Errorf("held entry: append: %w", err)
	}
}

// decisionOf reads a held call's decision: nil when none is stored.
func (l *Ledger) decisionOf(ctx context.Context, rec *protocol.CallRecord) (*protocol.ApprovalEntry, uint64, error) {
	m, err := l.lastForSubject(ctx, protocol.ApprovalSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil || m == nil {
		return nil, 0, err
	}
	var e protocol.ApprovalEntry
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return nil, 0, fmt.Errorf("decode approval entry %d: %w", m.Sequence, err)
	}
	return &e, m.Sequence, nil
}

// decide appends the held call's decision. won=false when another decision
// was stored first: the entry and sequence returned are then the winner's.
func (l *Ledger) decide(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord, decision, approver, reason string) (*protocol.ApprovalEntry, uint64, bool, error) {
	heldSeq, err := l.ensureHeld(ctx, by, rec)
	if err != nil {
		return nil, 0, false, err
	}
	e := &protocol.ApprovalEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID,
		TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, ToolName: rec.ToolName, ToolCallCardID: rec.ToolCallCardID,
		ArgumentsDigest: rec.Held.ArgumentsDigest, Decision: decision, Approver: approver, Reason: reason,
		DecidedUnixMS: time.Now().UnixMilli(), HeldSeq: heldSeq}
	data, err := json.Marshal(e)
	if err != nil {
		return nil, 0, false, fmt.Errorf("approval entry: encode: %w", err)
	}
	subj := protocol.ApprovalSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	msg := &nats.Msg{Subject: subj, Data: data, Header: approvalHeader(rec)}
	// The message id is this decision's own (a resend of it is one entry);
	// one shared by every decision of the call would answer a racing,
	// different decision as a duplicate instead of refusing it.
	msg.Header.Set(protocol.HeaderMsgID, fmt.Sprintf("approval.%s.%s.%s.%s.%s.%d", rec.ProjectID, rec.AgentTurnID, rec.ToolCallID, decision, approver, e.DecidedUnixMS))
	ack, err := l.appendEntry(ctx, by, protocol.KindApproval, msg, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case err == nil:
		if !ack.Duplicate {
			l.m.approvals.WithLabelValues(l.callToolLabel(rec), decision).Inc()
			l.log.Info("held call decided", "project", rec.ProjectID, "turn", rec.AgentTurnID, "call", rec.ToolCallID, "tool", rec.ToolName, "decision", decision, "approver", approver, "seq", ack.Sequence)
		}
		return e, ack.Sequence, true, nil
	case isWrongLastSeq(err):
		m, err := l.storedEntry(ctx, subj)
		if err != nil {
			return nil, 0, false, fmt.Errorf("approval entry: %w", err)
		}
		var won protocol.ApprovalEntry
		if err := json.Unmarshal(m.Data, &won); err != nil {
			return nil, 0, false, fmt.Errorf("decode approval entry %d: %w", m.Sequence, err)
		}
		return &won, m.Sequence, false, nil
	default:
		return nil, 0, false, fmt.Errorf("approval entry: append: %w", err)
	}
}

// decideInTime is decide for a decider other than the expiry: at or past
// the call's expiry with no decision stored, the expiry is the decision
// (stored here, by the ledger, and returned as the winner), so no decision
// is taken later than expires_unix_ms however late the keeper runs.
func (l *Ledger) decideInTime(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord, decision, approver, reason string) (*protocol.ApprovalEntry, uint64, bool, error) {
	if time.Now().UnixMilli() < rec.Held.ExpiresUnixMS {
		return l.decide(ctx, by, rec, decision, approver, reason)
	}
	e, seq, _, err := l.decide(ctx, nil, rec, protocol.ApprovalExpired, protocol.ApprovalExpirySource, "")
	return e, seq, false, err
}

// followUp is what a decision leads to, done (or found done) once.
type followUp struct {
	commandSeq uint64
	deadline   int64
	reportSeq  uint64
}

// finishDecision does whatever of the decision's follow-up is not done
// yet: for approved, the command, the approved wakeup and the record moved
// to dispatched; for any other decision, the result card, its report and
// the wakeup. Every step is idempotent, so any number of processes may run
// it, at any time after the decision.
func (l *Ledger) finishDecision(ctx context.Context, rec *protocol.CallRecord, e *protocol.ApprovalEntry, seq uint64) (followUp, error) {
	// The ledger's own entries: no caller's actor on them, no caller check.
	if e.Decision == protocol.ApprovalApproved {
		return l.release(ctx, rec, e, seq)
	}
	out, err := l.endHeld(ctx, rec, e)
	if err != nil {
		return followUp{}, fmt.Errorf("%s call %s/%s: %w", e.Decision, rec.AgentTurnID, rec.ToolCallID, err)
	}
	return followUp{reportSeq: out.Seq}, nil
}

// release publishes an approved call's command exactly as dispatch would
// have (same message id, the idempotency key, the deadline fixed at the
// decision's time plus the budget), wakes the worker with phase approved,
// and moves the record to dispatched.
func (l *Ledger) release(ctx context.Context, rec *protocol.CallRecord, e *protocol.ApprovalEntry, seq uint64) (followUp, error) {
	key := callKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)
	cur, rev, err := l.getRecord(ctx, key)
	if err != nil {
		return followUp{}, fmt.Errorf("release %s/%s: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	if cur == nil || cur.Held == nil {
		return followUp{}, fmt.Errorf("release %s/%s: the call record is gone", rec.AgentTurnID, rec.ToolCallID)
	}
	if cur.State != protocol.StateAwaitingApproval {
		return followUp{commandSeq: cur.CommandSeq, deadline: cur.DeadlineUnixMS}, nil
	}
	deadline := e.DecidedUnixMS + cur.Held.BudgetMS
	var payload protocol.ToolCommandPayload
	if err := json.Unmarshal(cur.Held.Payload, &payload); err != nil {
		return followUp{}, fmt.Errorf("release %s/%s: decode the held command: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	payload.DeadlineUnixMS = deadline
	cmd, err := json.Marshal(payload)
	if err != nil {
		return followUp{}, fmt.Errorf("release %s/%s: encode command: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	msg := &nats.Msg{Subject: cur.Subject, Data: cmd, Header: nats.Header{}}
	for k, v := range cur.Held.Header {
		msg.Header[k] = slices.Clone(v)
	}
	msg.Header.Set(protocol.HeaderMsgID, "cmd."+cur.ProjectID+"."+cur.AgentTurnID+"."+cur.ToolCallID)
	msg.Header.Set(protocol.HeaderIdempotencyKey, protocol.IdempotencyKey(cur.ProjectID, cur.AgentTurnID, cur.ToolCallID))
	// Held for approval first, then, approved, held by a pause of its
	// tool: its command waits for the resume, its deadline running.
	ack, held, err := l.commandOrHold(ctx, nil, cur, msg, deadline)
	if err != nil {
		return followUp{}, fmt.Errorf("release %s/%s: publish command: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	if held != nil {
		return l.holdApproved(ctx, key, cur, rev, held, deadline, seq)
	}
	if !ack.Duplicate {
		l.m.dispatches.WithLabelValues(l.callToolLabel(cur)).Inc()
	}
	if err := l.step(stepApprovalCommand); err != nil {
		return followUp{}, err
	}
	if err := l.wakeApproved(ctx, nil, cur, seq); err != nil {
		return followUp{}, fmt.Errorf("release %s/%s: wakeup: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	if err := l.step(stepApprovalWoken); err != nil {
		return followUp{}, err
	}
	// The record last: awaiting_approval with an approval stored is what
	// tells a follow-up not finished.
	next := cloneRecord(cur)
	for range 16 {
		next.State, next.CommandSeq, next.DeadlineUnixMS = protocol.StateDispatched, ack.Sequence, deadline
		_, ok, err := l.updateRecord(ctx, key, next, rev)
		if err != nil {
			return followUp{}, fmt.Errorf("release %s/%s: %w", rec.AgentTurnID, rec.ToolCallID, err)
		}
		if ok {
			return followUp{commandSeq: ack.Sequence, deadline: deadline}, nil
		}
		r, nrev, err := l.reread(ctx, key)
		if err != nil {
			return followUp{}, err
		}
		if r.State != protocol.StateAwaitingApproval {
			return followUp{commandSeq: r.CommandSeq, deadline: r.DeadlineUnixMS}, nil
		}
		next, rev = cloneRecord(r), nrev
	}
	return followUp{}, fmt.Errorf("release %s/%s: too many concurrent updates to the call record", rec.AgentTurnID, rec.ToolCallID)
}

// holdApproved finishes the follow-up of an approval whose tool is paused:
// the worker is woken (phase approved: the decision is made) and the
// record moves from awaiting_approval to paused with its deadline.
func (l *Ledger) holdApproved(ctx context.Context, key string, cur *protocol.CallRecord, rev uint64, held *protocol.PausedCall, deadline int64, approvalSeq uint64) (followUp, error) {
	if err := l.wakeApproved(ctx, nil, cur, approvalSeq); err != nil {
		return followUp{}, fmt.Errorf("release %s/%s: wakeup: %w", cur.AgentTurnID, cur.ToolCallID, err)
	}
	next := cloneRecord(cur)
	for range 16 {
		next.State, next.DeadlineUnixMS, next.Paused = protocol.StatePaused, deadline, held
		_, ok, err := l.updateRecord(ctx, key, next, rev)
		if err != nil {
			return followUp{}, fmt.Errorf("release %s/%s: %w", cur.AgentTurnID, cur.ToolCallID, err)
		}
		if ok {
			return followUp{deadline: deadline}, nil
		}
		r, nrev, err := l.reread(ctx, key)
		if err != nil {
			return followUp{}, err
		}
		if r.State != protocol.StateAwaitingApproval {
			return followUp{commandSeq: r.CommandSeq, deadline: r.DeadlineUnixMS}, nil
		}
		next, rev = cloneRecord(r), nrev
	}
	return followUp{}, fmt.Errorf("release %s/%s: too many concurrent updates to the call record", cur.AgentTurnID, cur.ToolCallID)
}

// wakeApproved tells the worker its held call was approved and its
// command published (phase approved: not a result); nothing when the agent
// has no roster entry.
func (l *Ledger) wakeApproved(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord, approvalSeq uint64) error {
	roster, err := l.rosterCached(ctx, rec.ProjectID, rec.AgentID)
	if isCode(err, protocol.CodeNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	data, err := json.Marshal(protocol.WakeupEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID,
		WorkerTarget: roster.WorkerTarget, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID,
		Status: protocol.ApprovalApproved, ReportSeq: approvalSeq, Phase: protocol.ApprovalApproved})
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: protocol.WakeupSubject(l.version, rec.ProjectID, rec.ChannelID, roster.WorkerTarget), Data: data,
		Header: protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, StepID: rec.StepID}.Header()}
	msg.Header.Set(protocol.HeaderMsgID, "wakeup.approved."+rec.ProjectID+"."+rec.AgentTurnID+"."+rec.ToolCallID)
	ack, err := l.appendEntry(ctx, by, protocol.KindWakeup, msg)
	if err != nil {
		return err
	}
	if !ack.Duplicate {
		l.m.wakeups.Inc()
	}
	return nil
}

// approvalCardID is the id of the result card of a held call's denial,
// expiry or cancel: one per call, so every process writes the same card.
func approvalCardID(rec *protocol.CallRecord) string {
	h := sha256.Sum256([]byte(rec.ProjectID + "\x00" + rec.AgentTurnID + "\x00" + rec.ToolCallID))
	return "res-approval-" + hex.EncodeToString(h[:16])
}

// approvalResult is the status and tool.result content of a held call
// ended by its decision, in the executor's shape. It depends on the record
// and the decision only, so any process writes the same bytes.
func approvalResult(rec *protocol.CallRecord, e *protocol.ApprovalEntry) (string, json.RawMessage, error) {
	type detail struct {
		TaxonomyCode  string `json:"taxonomy_code,omitempty"`
		Class         string `json:"class"`
		FixHint       string `json:"fix_hint,omitempty"`
		Attempts      int    `json:"attempts"`
		Decision      string `json:"decision"`
		Approver      string `json:"approver"`
		Reason        string `json:"reason,omitempty"`
		DecidedUnixMS int64  `json:"decided_unix_ms"`
		ExpiresUnixMS int64  `json:"expires_unix_ms,omitempty"`
	}
	d := detail{Class: "terminal_error", Decision: e.Decision, Approver: e.Approver, Reason: e.Reason, DecidedUnixMS: e.DecidedUnixMS}
	status := protocol.StatusFailed
	var code, msg string
	switch e.Decision {
	case protocol.ApprovalDenied:
		code, d.TaxonomyCode = protocol.ErrorCodeAuthFailed, protocol.TaxonomyApprovalDenied
		msg = fmt.Sprintf("approver %s denied the call", e.Approver)
		if e.Reason != "" {
			msg += ": " + e.Reason
		}
		d.FixHint = "the tool never ran; read the approver's reason before asking again"
	case protocol.ApprovalExpired:
		code, d.TaxonomyCode = protocol.ErrorCodeBadRequest, protocol.TaxonomyApprovalExpired
		d.ExpiresUnixMS = rec.Held.ExpiresUnixMS
		msg = fmt.Sprintf("no approver decided on the call by %s; the ledger recorded its expiry", protocol.FormatTime(time.UnixMilli(rec.Held.ExpiresUnixMS)))
		d.FixHint = "the tool never ran; dispatch the call again (a new tool_call_id) when an approver is available, or raise the tool's approval.timeout_ms"
	case protocol.ApprovalCanceled:
		status, code = protocol.StatusCanceled, protocol.ErrorCodeCanceled
		msg = "the call was canceled while held for approval; the tool never ran"
	default:
		return "", nil, fmt.Errorf("decision %q ends no call", e.Decision)
	}
	content, err := json.Marshal(struct {
		Status string            `json:"status"`
		Result map[string]string `json:"result"`
		Error  any               `json:"error"`
	}{
		Status: status,
		Result: map[string]string{"error_code": code, "error_message": msg},
		Error: struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Detail  detail `json:"detail"`
		}{code, msg, d},
	})
	return status, content, err
}

// endHeld ends a held call its decision denied, expired or canceled: the
// ledger's result card, then its report through the report path's claim
// (which wakes the worker), as the deadline's timeout does.
func (l *Ledger) endHeld(ctx context.Context, rec *protocol.CallRecord, e *protocol.ApprovalEntry) (protocol.ReportOutcome, error) {
	status, content, err := approvalResult(rec, e)
	if err != nil {
		return protocol.ReportOutcome{}, err
	}
	fn := deadlineFunction(rec)
	card := &protocol.Card{
		CardID: approvalCardID(rec), ProjectID: rec.ProjectID, Type: protocol.CardToolResult,
		AuthorID: protocol.LedgerSourceID, FunctionName: fn, AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID,
		Content: content, Metadata: rec.CardMetadata,
	}
	raw := func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", nil, content) }
	if _, err := l.putCard(ctx, nil, protocol.OpReport, card, nil, rec.ChannelID, raw); err != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("result card: %w", err)
	}
	in := &reportInput{
		project: rec.ProjectID, channel: rec.ChannelID, sourceID: protocol.LedgerSourceID, sourceFunction: fn,
		id:       protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, StepID: rec.StepID},
		payload:  protocol.ReportPayload{Status: status, AfterExecution: rec.AfterExecution, ToolResultCardID: card.CardID, StepID: rec.StepID},
		stepID:   rec.StepID,
		approval: true,
	}
	return l.report(ctx, nil, in, raw)
}

// Approve records an approver's approval of a held call (the approve op)
// and publishes its command. approver is the approver's name (the actor of
// the op's API subject).
func (l *Ledger) Approve(ctx context.Context, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
	return l.approvalReq(ctx, protocol.OpApprove, approver, req)
}

// Deny records an approver's denial of a held call (the deny op), which
// ends it failed (A-APPROVAL-DENIED).
func (l *Ledger) Deny(ctx context.Context, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
	return l.approvalReq(ctx, protocol.OpDeny, approver, req)
}

// approvalReq is Approve and Deny: a certainly valid request goes to the
// core as it is; any other takes the API's parser (approvalJSON).
func (l *Ledger) approvalReq(ctx context.Context, op, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
	by := atEdge(ctx, req.ProjectID, approver)
	ident := protocol.ValidIdentifier
	if !ident(approver) || !ident(req.ProjectID) || !ident(req.AgentTurnID) || !ident(req.ToolCallID) ||
		!ident(req.ToolCallCardID) || !protocol.ValidArgumentsDigest(req.ArgumentsDigest) ||
		!certainText(req.Reason, protocol.MaxApprovalReasonBytes, false) {
		return viaWire(ctx, op, req, func(ctx context.Context, body []byte) (protocol.ApprovalResult, error) {
			return l.approvalJSON(ctx, by, op, approver, body)
		})
	}
	return l.approval(ctx, by, op, approver, req, rawOf(req))
}

// approvalJSON decides a held call for approver, or refuses (and records)
// the request listing every violation: unknown_call, conflict (not held,
// or decided already: the winner named), forbidden (an approver the tool
// does not list, or the call's own agent without allow_self_approval),
// mismatch (another card, another digest). With violations of several
// kinds the code is the first of conflict, forbidden, mismatch.
func (l *Ledger) approvalJSON(ctx context.Context, by *protocol.Caller, op, approver string, body []byte) (protocol.ApprovalResult, error) {
	req, vs := protocol.ParseApprovalRequest(body)
	raw := rawBody(body)
	if !protocol.ValidIdentifier(approver) {
		vs.Add("approver", protocol.VInvalidToken, "approver name %q is not an identifier", protocol.Clip(approver))
	}
	if len(vs) > 0 {
		return protocol.ApprovalResult{}, l.reject(ctx, by, op, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeBadRequest, vs, "invalid %s: %d violation(s)", op, len(vs)), raw())
	}
	return l.approval(ctx, by, op, approver, req, raw)
}

// approval is the one core of approve and deny, typed or received: req is
// valid, approver a valid name, raw the request a refusal records.
func (l *Ledger) approval(ctx context.Context, by *protocol.Caller, op, approver string, req protocol.ApprovalRequest, raw func() protocol.RejectedRequest) (protocol.ApprovalResult, error) {
	var vs protocol.Violations
	key := callKey(req.ProjectID, req.AgentTurnID, req.ToolCallID)
	rec, _, err := l.getRecord(ctx, key)
	if err != nil {
		return protocol.ApprovalResult{}, fmt.Errorf("%s %s/%s: %w", op, req.AgentTurnID, req.ToolCallID, err)
	}
	if rec != nil {
		confirmed, _, err := l.dispatchConfirmed(ctx, rec)
		if err != nil {
			return protocol.ApprovalResult{}, fmt.Errorf("%s %s/%s: %w", op, req.AgentTurnID, req.ToolCallID, err)
		}
		if !confirmed {
			rec = nil
		}
	}
	if rec == nil {
		vs.Add("body.tool_call_id", protocol.VNotFound, "no call %s in turn %s of project %s was dispatched through the ledger", req.ToolCallID, req.AgentTurnID, req.ProjectID)
		return protocol.ApprovalResult{}, l.reject(ctx, by, op, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeUnknownCall, vs, "unknown call %s", req.ToolCallID), raw())
	}
	refuse := func(code protocol.Code, vs protocol.Violations, format string, args ...any) (protocol.ApprovalResult, error) {
		return protocol.ApprovalResult{}, l.reject(ctx, by, op, rec.ProjectID, rec.ChannelID, protocol.NewError(code, vs, format, args...), raw())
	}
	if rec.Held == nil {
		vs.Add("body.tool_call_id", protocol.VConflict, "call %s was not held for approval (state %s): there is nothing to decide", rec.ToolCallID, rec.State)
		return refuse(protocol.CodeConflict, vs, "call %s is not held for approval", rec.ToolCallID)
	}
	var conflicts, forbidden, mismatches protocol.Violations
	if req.ToolCallCardID != rec.ToolCallCardID {
		mismatches.Add("body.tool_call_card_id", protocol.VMismatch, "call %s's tool.call card is %s, not %s", rec.ToolCallID, rec.ToolCallCardID, req.ToolCallCardID)
	}
	if req.ArgumentsDigest != rec.Held.ArgumentsDigest {
		mismatches.Add("body.arguments_digest", protocol.VMismatch, "the arguments of call %s digest to %s, not %s: they are not the arguments you decided on", rec.ToolCallID, rec.Held.ArgumentsDigest, req.ArgumentsDigest)
	}
	terms := &protocol.ToolApproval{Approvers: rec.Held.Approvers}
	if !terms.MayApprove(approver) {
		forbidden.Add("approver", protocol.VForbidden, "approver %q is not among the approvers of tool %s (%v)", approver, rec.ToolName, rec.Held.Approvers)
	}
	if approver == rec.AgentID && !rec.Held.AllowSelfApproval {
		forbidden.Add("approver", protocol.VForbidden, "approver %q is the agent that made call %s, and tool %s does not allow self-approval", approver, rec.ToolCallID, rec.ToolName)
	}
	decided, seq, err := l.decisionOf(ctx, rec)
	if err != nil {
		return protocol.ApprovalResult{}, fmt.Errorf("%s %s/%s: %w", op, req.AgentTurnID, req.ToolCallID, err)
	}
	if decided == nil && len(forbidden)+len(mismatches) == 0 {
		decision := protocol.ApprovalApproved
		if op == protocol.OpDeny {
			decision = protocol.ApprovalDenied
		}
		e, s, won, err := l.decideInTime(ctx, by, rec, decision, approver, req.Reason)
		if err != nil {
			return protocol.ApprovalResult{}, fmt.Errorf("%s %s/%s: %w", op, req.AgentTurnID, req.ToolCallID, err)
		}
		if err := l.step(stepApprovalDecided); err != nil {
			return protocol.ApprovalResult{}, err
		}
		if won {
			f, err := l.finishDecision(ctx, rec, e, s)
			if err != nil {
				return protocol.ApprovalResult{}, fmt.Errorf("%s %s/%s: %w", op, req.AgentTurnID, req.ToolCallID, err)
			}
			return protocol.ApprovalResult{Seq: s, Decision: decision, CommandSeq: f.commandSeq, DeadlineUnixMS: f.deadline, ReportSeq: f.reportSeq}, nil
		}
		decided, seq = e, s
	}
	if decided != nil {
		// Whoever finds a decision its decider left unfinished (its lease
		// over) finishes its follow-up: a retried op after a crash leaves
		// nothing undone.
		if l.leaseOver(decided) {
			if _, err := l.finishDecision(ctx, rec, decided, seq); err != nil {
				return protocol.ApprovalResult{}, fmt.Errorf("%s %s/%s: finish the decision: %w", op, req.AgentTurnID, req.ToolCallID, err)
			}
		}
		conflicts.Add("body.tool_call_id", protocol.VConflict, "call %s was already decided: %s by %s at %s (seq %d)", rec.ToolCallID, decided.Decision, decided.Approver, protocol.FormatTime(time.UnixMilli(decided.DecidedUnixMS)), seq)
	}
	all := append(append(conflicts, forbidden...), mismatches...)
	switch {
	case len(conflicts) > 0:
		return refuse(protocol.CodeConflict, all, "call %s was already %s by %s", rec.ToolCallID, decided.Decision, decided.Approver)
	case len(forbidden) > 0:
		return refuse(protocol.CodeForbidden, all, "%s may not decide call %s", approver, rec.ToolCallID)
	default:
		return refuse(protocol.CodeMismatch, all, "%s names another card or other arguments than call %s's", op, rec.ToolCallID)
	}
}

// cancelHeld cancels a call held for approval: its decision is canceled
// (through the approval subject, so it races approvals and expiry like any
// decision). done=false when the call is no longer held (an approval won:
// the caller cancels it as a dispatched call; or a denial or expiry ended
// it: the caller refuses, already reported). decider is recorded as the
// decision's approver: the agent for its own cancel, the admin's actor for
// an operator's (call.cancel).
func (l *Ledger) cancelHeld(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord, decider, reason string) (protocol.CancelResult, bool, error) {
	var e *protocol.ApprovalEntry
	var seq uint64
	won := false
	var err error
	if rec.State == protocol.StateAwaitingApproval {
		e, seq, won, err = l.decideInTime(ctx, by, rec, protocol.ApprovalCanceled, decider, reason)
	} else {
		e, seq, err = l.decisionOf(ctx, rec)
	}
	if err != nil {
		return protocol.CancelResult{}, false, fmt.Errorf("cancel %s/%s: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	if e == nil {
		return protocol.CancelResult{}, false, nil
	}
	if won {
		if err := l.step(stepApprovalDecided); err != nil {
			return protocol.CancelResult{}, false, err
		}
	}
	if won || l.leaseOver(e) {
		if _, err := l.finishDecision(ctx, rec, e, seq); err != nil {
			return protocol.CancelResult{}, false, fmt.Errorf("cancel %s/%s: %w", rec.AgentTurnID, rec.ToolCallID, err)
		}
	}
	if e.Decision != protocol.ApprovalCanceled {
		return protocol.CancelResult{}, false, nil
	}
	return protocol.CancelResult{Seq: seq, Duplicate: !won}, true, nil
}

// leaseOver reports whether anyone who finds d's follow-up unfinished may
// finish it now. An approval's follow-up (the command and the approved
// wakeup, which core NATS subscribers receive at every publish) is its
// decider's alone until its lease (Config.ApprovalLease) is over; any other
// decision ends the call through the report path, which stores and wakes
// once however many finish it.
func (l *Ledger) leaseOver(d *protocol.ApprovalEntry) bool {
	return d.Decision != protocol.ApprovalApproved || time.Since(time.UnixMilli(d.DecidedUnixMS)) >= l.approvalLease
}

// settleHeld finishes the follow-up of an approval that is not done yet
// (once its decider's lease is over; within it, the record is returned as
// the decision makes it, dispatched) and returns the record as it then
// is: an approved call's command may be out before its record says
// dispatched, and whoever takes the command (an executor, the deadline
// keeper) must find the call dispatched, not held. Any other record is
// returned as it is.
func (l *Ledger) settleHeld(ctx context.Context, rec *protocol.CallRecord) (*protocol.CallRecord, error) {
	if rec.State != protocol.StateAwaitingApproval || rec.Held == nil {
		return rec, nil
	}
	d, seq, err := l.decisionOf(ctx, rec)
	if err != nil || d == nil || d.Decision != protocol.ApprovalApproved {
		return rec, err
	}
	if !l.leaseOver(d) {
		// Its decider is publishing the command now: the call reads as
		// approved and dispatched (its deadline is fixed by the decision),
		// and nothing is published twice.
		view := cloneRecord(rec)
		view.State, view.DeadlineUnixMS = protocol.StateDispatched, d.DecidedUnixMS+rec.Held.BudgetMS
		return view, nil
	}
	if _, err := l.finishDecision(ctx, rec, d, seq); err != nil {
		return nil, err
	}
	r, _, err := l.reread(ctx, callKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID))
	return r, err
}
