package ledger

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ConsumeRequest says an agent has consumed the reported result of one of its
// calls from its Inbox.
type ConsumeRequest struct {
	ProjectID   string `json:"project_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
}

// ConsumeResult is the outcome of a consume.
type ConsumeResult struct {
	Seq       uint64 `json:"seq"`
	ReportSeq uint64 `json:"report_seq"`
	// Duplicate is true when the result had already been consumed; Seq is
	// then the original consumed entry's.
	Duplicate bool `json:"duplicate"`
}

// Consume records that the agent consumed a call's reported result. It is
// idempotent: the consumed entry's subject is unique to the call and appended
// at most once, so the Inbox can be rebuilt exactly from the ledger.
func (l *Ledger) Consume(ctx context.Context, req ConsumeRequest) (ConsumeResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return ConsumeResult{}, fmt.Errorf("consume: encode: %w", err)
	}
	return l.ConsumeJSON(ctx, body)
}

// ConsumeJSON is Consume for a JSON body, as received over the API.
func (l *Ledger) ConsumeJSON(ctx context.Context, body []byte) (ConsumeResult, error) {
	var vs Violations
	var req ConsumeRequest
	if o, ok := parseObject("body", body, &vs); ok {
		req = ConsumeRequest{ProjectID: o.ident("project_id", true), AgentID: o.ident("agent_id", true),
			AgentTurnID: o.ident("agent_turn_id", true), ToolCallID: o.ident("tool_call_id", true)}
	}
	raw := func() RejectedRequest { return rejectedRequest("", nil, body) }
	if len(vs) > 0 {
		return ConsumeResult{}, l.reject(ctx, OpConsume, req.ProjectID, Unrouted, newError(CodeBadRequest, vs, "invalid consume: %d violation(s)", len(vs)), raw())
	}
	// A cached record may be behind (not yet woken): the report's stream
	// subject is read then, below.
	rec, _, err := l.recordCached(ctx, callKey(req.ProjectID, req.AgentTurnID, req.ToolCallID))
	if err != nil {
		return ConsumeResult{}, fmt.Errorf("consume %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
	}
	if rec == nil {
		vs.Add("body.tool_call_id", VNotFound, "no call %s in turn %s was dispatched through the ledger", req.ToolCallID, req.AgentTurnID)
		return ConsumeResult{}, l.reject(ctx, OpConsume, req.ProjectID, Unrouted, newError(CodeUnknownCall, vs, "unknown call %s", req.ToolCallID), raw())
	}
	if rec.AgentID != req.AgentID {
		vs.Add("body.agent_id", VMismatch, "call %s belongs to agent %q, not %q", rec.ToolCallID, rec.AgentID, req.AgentID)
		return ConsumeResult{}, l.reject(ctx, OpConsume, rec.ProjectID, rec.ChannelID, newError(CodeMismatch, vs, "call %s is not agent %s's", rec.ToolCallID, req.AgentID), raw())
	}
	reportSeq := uint64(0)
	if rec.Claim != nil {
		reportSeq = rec.Claim.Seq
	}
	if reportSeq == 0 {
		// The report may be stored while the record is not yet marked.
		m, err := l.lastForSubject(ctx, ReportSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
		if err != nil {
			return ConsumeResult{}, fmt.Errorf("consume %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
		}
		if m != nil {
			reportSeq = m.Sequence
		}
	}
	if reportSeq == 0 {
		vs.Add("body.tool_call_id", "not_reported", "call %s has no accepted report yet", rec.ToolCallID)
		return ConsumeResult{}, l.reject(ctx, OpConsume, rec.ProjectID, rec.ChannelID, newError(CodeNotReported, vs, "call %s has not been reported", rec.ToolCallID), raw())
	}
	data, err := json.Marshal(ConsumedEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID,
		AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID, ReportSeq: reportSeq})
	if err != nil {
		return ConsumeResult{}, fmt.Errorf("consume: encode entry: %w", err)
	}
	subj := ConsumedSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	msg := &nats.Msg{Subject: subj, Data: data, Header: Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID}.Header()}
	msg.Header.Set(HeaderProjectID, rec.ProjectID)
	msg.Header.Set(HeaderChannelID, rec.ChannelID)
	ack, err := l.appendEntry(ctx, KindConsumed, msg, jetstream.WithExpectLastSequencePerSubject(0))
	if err == nil {
		return ConsumeResult{Seq: ack.Sequence, ReportSeq: reportSeq}, nil
	}
	if !isWrongLastSeq(err) {
		return ConsumeResult{}, fmt.Errorf("consume %s/%s: append: %w", req.AgentTurnID, req.ToolCallID, err)
	}
	existing, gerr := l.lastForSubject(ctx, subj)
	if gerr != nil || existing == nil {
		return ConsumeResult{}, fmt.Errorf("consume %s/%s: consumed entry exists but cannot be read: %v", req.AgentTurnID, req.ToolCallID, gerr)
	}
	return ConsumeResult{Seq: existing.Sequence, ReportSeq: reportSeq, Duplicate: true}, nil
}
