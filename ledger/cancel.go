package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cancel records a cancellation request for a dispatched, not yet reported
// call. Executors running the call stop it and report status canceled;
// executors that pick the command up later report canceled without running.
// A call that already has a report cannot be canceled (conflict).
func (l *Ledger) Cancel(ctx context.Context, req protocol.CancelRequest) (protocol.CancelResult, error) {
	by := callerOf(ctx)
	ident := protocol.ValidIdentifier
	if ident(req.ProjectID) && ident(req.AgentID) && ident(req.AgentTurnID) && ident(req.ToolCallID) && utf8.ValidString(req.Reason) {
		// Certainly valid: what the API's parser would read back from its
		// JSON, with no violation.
		return l.cancel(ctx, by, req, rawOf(req))
	}
	return viaWire(ctx, protocol.OpCancel, req, func(ctx context.Context, body []byte) (protocol.CancelResult, error) {
		return l.cancelJSON(ctx, by, body)
	})
}

// cancelJSON is Cancel for a JSON body, as received over the API.
func (l *Ledger) cancelJSON(ctx context.Context, by *protocol.Caller, body []byte) (protocol.CancelResult, error) {
	req, vs := protocol.ParseCancelRequest(body)
	raw := rawBody(body)
	if len(vs) > 0 {
		return protocol.CancelResult{}, l.reject(ctx, by, protocol.OpCancel, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeBadRequest, vs, "invalid cancel: %d violation(s)", len(vs)), raw())
	}
	return l.cancel(ctx, by, req, raw)
}

// cancel is the one core of a cancel, typed or received: req is valid, raw
// is the request a refusal records.
func (l *Ledger) cancel(ctx context.Context, by *protocol.Caller, req protocol.CancelRequest, raw func() protocol.RejectedRequest) (protocol.CancelResult, error) {
	var vs protocol.Violations
	rec, err := l.cancelTarget(ctx, by, protocol.OpCancel, req.ProjectID, req.AgentTurnID, req.ToolCallID, raw)
	if err != nil {
		return protocol.CancelResult{}, err
	}
	if rec.AgentID != req.AgentID {
		vs.Add("body.agent_id", protocol.VMismatch, "call %s belongs to agent %q, not %q", rec.ToolCallID, rec.AgentID, req.AgentID)
		return protocol.CancelResult{}, l.reject(ctx, by, protocol.OpCancel, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeMismatch, vs, "call %s is not agent %s's", rec.ToolCallID, req.AgentID), raw())
	}
	res, err := l.cancelCall(ctx, by, protocol.OpCancel, rec, rec.AgentID, req.Reason, raw)
	return protocol.CancelResult{Seq: res.Seq, Duplicate: res.Duplicate}, err
}

// cancelTarget reads the call a cancel names, or refuses (and records) op
// with unknown_call when no such call was dispatched through the ledger.
func (l *Ledger) cancelTarget(ctx context.Context, by *protocol.Caller, op, project, turn, call string, raw func() protocol.RejectedRequest) (*protocol.CallRecord, error) {
	rec, _, err := l.getRecord(ctx, callKey(project, turn, call))
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", op, turn, call, err)
	}
	if rec != nil {
		confirmed, _, err := l.dispatchConfirmed(ctx, rec)
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", op, turn, call, err)
		}
		if !confirmed {
			rec = nil
		}
	}
	if rec == nil {
		var vs protocol.Violations
		vs.Add("body.tool_call_id", protocol.VNotFound, "no call %s in turn %s was dispatched through the ledger", call, turn)
		return nil, l.reject(ctx, by, op, project, protocol.Unrouted, protocol.NewError(protocol.CodeUnknownCall, vs, "unknown call %s", call), raw())
	}
	return rec, nil
}

// cancelCall cancels rec for op (a worker's cancel or an operator's
// call.cancel): a held call through its approval decision, recorded with
// decider as approver; any other through the one cancel entry of the call,
// which the caller's actor (CG-Actor) tells apart. A call already reported
// is refused conflict, recorded as op's rejection.
func (l *Ledger) cancelCall(ctx context.Context, by *protocol.Caller, op string, rec *protocol.CallRecord, decider, reason string, raw func() protocol.RejectedRequest) (protocol.OperatorCancelResult, error) {
	var err error
	if rec.Held != nil && rec.CommandSeq == 0 {
		// A held call has no command to stop: its cancel is its decision.
		res, done, err := l.cancelHeld(ctx, by, rec, decider, reason)
		if err != nil || done {
			return protocol.OperatorCancelResult{Seq: res.Seq, Duplicate: res.Duplicate, Entry: protocol.KindApproval}, err
		}
		// Approved (now dispatched) or ended by another decision first.
		turn, call := rec.AgentTurnID, rec.ToolCallID
		if rec, _, err = l.getRecord(ctx, callKey(rec.ProjectID, turn, call)); err != nil {
			return protocol.OperatorCancelResult{}, fmt.Errorf("%s %s/%s: %w", op, turn, call, err)
		}
		if rec == nil {
			return protocol.OperatorCancelResult{}, fmt.Errorf("%s %s/%s: the call record is gone after its approval decision", op, turn, call)
		}
	}
	subj := protocol.CancelSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	reportSubj := protocol.ReportSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	if prev, err := l.lastForSubject(ctx, subj); err != nil {
		return protocol.OperatorCancelResult{}, fmt.Errorf("%s %s/%s: %w", op, rec.AgentTurnID, rec.ToolCallID, err)
	} else if prev != nil {
		return protocol.OperatorCancelResult{Seq: prev.Sequence, Duplicate: true, Entry: protocol.KindCancel}, nil
	}
	alreadyReported := func() (protocol.OperatorCancelResult, error) {
		status := "unknown status"
		if m, _ := l.lastForSubject(ctx, reportSubj); m != nil {
			if c, err := l.claimFromEntry(m); err == nil {
				status = c.Status
			}
		}
		var vs protocol.Violations
		vs.Add("body.tool_call_id", protocol.VConflict, "call %s already has a report (%s)", rec.ToolCallID, status)
		return protocol.OperatorCancelResult{}, l.reject(ctx, by, op, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeConflict, vs, "call %s is already reported", rec.ToolCallID), raw())
	}
	// A call held by a pause of its tool is canceled as a dispatched one
	// is: the cancel is recorded, and the service that takes its command
	// after the resume finds it (the executor answers canceled).
	if rec.State != protocol.StateDispatched && rec.State != protocol.StatePaused {
		return alreadyReported()
	}
	data, err := json.Marshal(protocol.CancelEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID,
		AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID, Reason: reason})
	if err != nil {
		return protocol.OperatorCancelResult{}, fmt.Errorf("%s: encode entry: %w", op, err)
	}
	msg := &nats.Msg{Subject: subj, Data: data, Header: protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID}.Header()}
	msg.Header.Set(protocol.HeaderProjectID, rec.ProjectID)
	msg.Header.Set(protocol.HeaderChannelID, rec.ChannelID)
	// Concurrent cancels of one call (a worker's and an operator's alike)
	// store one entry (the others are told duplicate); a later one finds
	// it above.
	msg.Header.Set(protocol.HeaderMsgID, "cancel."+rec.ProjectID+"."+rec.AgentTurnID+"."+rec.ToolCallID)
	// The append itself checks that the call has no report: a report
	// stored between any read above and this append makes it fail, so a
	// cancel is never stored after its call's report.
	ack, err := l.appendEntry(ctx, by, protocol.KindCancel, msg, jetstream.WithExpectLastSequenceForSubject(0, reportSubj))
	switch {
	case err == nil:
		return protocol.OperatorCancelResult{Seq: ack.Sequence, Duplicate: ack.Duplicate, Entry: protocol.KindCancel}, nil
	case isWrongLastSeq(err):
		return alreadyReported()
	default:
		return protocol.OperatorCancelResult{}, fmt.Errorf("%s %s/%s: append: %w", op, rec.AgentTurnID, rec.ToolCallID, err)
	}
}

// Canceled reports whether a cancellation was recorded for the call.
func (l *Ledger) Canceled(ctx context.Context, project, channel, turnID, callID string) (bool, error) {
	m, err := l.lastForSubject(ctx, protocol.CancelSubject(l.version, project, channel, turnID, callID))
	if err != nil {
		return false, fmt.Errorf("cancel lookup %s/%s: %w", turnID, callID, err)
	}
	return m != nil, nil
}
