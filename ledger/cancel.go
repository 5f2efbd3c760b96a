package ledger

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// CancelRequest asks to cancel a call in flight.
type CancelRequest struct {
	ProjectID   string `json:"project_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	Reason      string `json:"reason,omitempty"`
}

// CancelResult is the outcome of a cancel request.
type CancelResult struct {
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
}

// Cancel records a cancellation request for a dispatched, not yet reported
// call. Executors running the call stop it and report status canceled;
// executors that pick the command up later report canceled without running.
// A call that already has a report cannot be canceled (conflict).
func (l *Ledger) Cancel(ctx context.Context, req CancelRequest) (CancelResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return CancelResult{}, fmt.Errorf("cancel: encode: %w", err)
	}
	return l.CancelJSON(ctx, body)
}

// CancelJSON is Cancel for a JSON body, as received over the API.
func (l *Ledger) CancelJSON(ctx context.Context, body []byte) (CancelResult, error) {
	var vs Violations
	var req CancelRequest
	if o, ok := parseObject("body", body, &vs); ok {
		req = CancelRequest{ProjectID: o.ident("project_id", true), AgentID: o.ident("agent_id", true),
			AgentTurnID: o.ident("agent_turn_id", true), ToolCallID: o.ident("tool_call_id", true), Reason: o.str("reason", false)}
	}
	raw := func() RejectedRequest { return rejectedRequest("", nil, body) }
	if len(vs) > 0 {
		return CancelResult{}, l.reject(ctx, OpCancel, req.ProjectID, Unrouted, newError(CodeBadRequest, vs, "invalid cancel: %d violation(s)", len(vs)), raw())
	}
	rec, _, err := l.getRecord(ctx, callKey(req.ProjectID, req.AgentTurnID, req.ToolCallID))
	if err != nil {
		return CancelResult{}, fmt.Errorf("cancel %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
	}
	if rec != nil {
		confirmed, _, err := l.dispatchConfirmed(ctx, rec)
		if err != nil {
			return CancelResult{}, fmt.Errorf("cancel %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
		}
		if !confirmed {
			rec = nil
		}
	}
	if rec == nil {
		vs.Add("body.tool_call_id", VNotFound, "no call %s in turn %s was dispatched through the ledger", req.ToolCallID, req.AgentTurnID)
		return CancelResult{}, l.reject(ctx, OpCancel, req.ProjectID, Unrouted, newError(CodeUnknownCall, vs, "unknown call %s", req.ToolCallID), raw())
	}
	if rec.AgentID != req.AgentID {
		vs.Add("body.agent_id", VMismatch, "call %s belongs to agent %q, not %q", rec.ToolCallID, rec.AgentID, req.AgentID)
		return CancelResult{}, l.reject(ctx, OpCancel, rec.ProjectID, rec.ChannelID, newError(CodeMismatch, vs, "call %s is not agent %s's", rec.ToolCallID, req.AgentID), raw())
	}
	subj := CancelSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	reportSubj := ReportSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	if prev, err := l.lastForSubject(ctx, subj); err != nil {
		return CancelResult{}, fmt.Errorf("cancel %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
	} else if prev != nil {
		return CancelResult{Seq: prev.Sequence, Duplicate: true}, nil
	}
	alreadyReported := func() (CancelResult, error) {
		status := "unknown status"
		if m, _ := l.lastForSubject(ctx, reportSubj); m != nil {
			if c, err := l.claimFromEntry(m); err == nil {
				status = c.Status
			}
		}
		vs.Add("body.tool_call_id", VConflict, "call %s already has a report (%s)", rec.ToolCallID, status)
		return CancelResult{}, l.reject(ctx, OpCancel, rec.ProjectID, rec.ChannelID, newError(CodeConflict, vs, "call %s is already reported", rec.ToolCallID), raw())
	}
	if rec.State != StateDispatched {
		return alreadyReported()
	}
	data, err := json.Marshal(CancelEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID,
		AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID, Reason: req.Reason})
	if err != nil {
		return CancelResult{}, fmt.Errorf("cancel: encode entry: %w", err)
	}
	msg := &nats.Msg{Subject: subj, Data: data, Header: Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID}.Header()}
	msg.Header.Set(HeaderProjectID, rec.ProjectID)
	msg.Header.Set(HeaderChannelID, rec.ChannelID)
	// Concurrent cancels of one call store one entry (the others are told
	// duplicate); a later one finds it above.
	msg.Header.Set(HeaderMsgID, "cancel."+rec.ProjectID+"."+rec.AgentTurnID+"."+rec.ToolCallID)
	// The append itself checks that the call has no report: a report
	// stored between any read above and this append makes it fail, so a
	// cancel is never stored after its call's report.
	ack, err := l.appendEntry(ctx, KindCancel, msg, jetstream.WithExpectLastSequenceForSubject(0, reportSubj))
	switch {
	case err == nil:
		return CancelResult{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
	case isWrongLastSeq(err):
		return alreadyReported()
	default:
		return CancelResult{}, fmt.Errorf("cancel %s/%s: append: %w", req.AgentTurnID, req.ToolCallID, err)
	}
}

// Canceled reports whether a cancellation was recorded for the call.
func (l *Ledger) Canceled(ctx context.Context, project, channel, turnID, callID string) (bool, error) {
	m, err := l.lastForSubject(ctx, CancelSubject(l.version, project, channel, turnID, callID))
	if err != nil {
		return false, fmt.Errorf("cancel lookup %s/%s: %w", turnID, callID, err)
	}
	return m != nil, nil
}
