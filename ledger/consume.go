package ledger

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Consume records that the agent consumed a call's reported result. It is
// idempotent: the consumed entry's subject is unique to the call and appended
// at most once, so the Inbox can be rebuilt exactly from the ledger.
func (l *Ledger) Consume(ctx context.Context, req protocol.ConsumeRequest) (protocol.ConsumeResult, error) {
	by := callerOf(ctx)
	raw := func() protocol.RejectedRequest {
		// Four strings: the encoding cannot fail.
		body, _ := json.Marshal(req)
		return protocol.NewRejectedRequest("", nil, body)
	}
	if protocol.ValidIdentifier(req.ProjectID) && protocol.ValidIdentifier(req.AgentID) &&
		protocol.ValidIdentifier(req.AgentTurnID) && protocol.ValidIdentifier(req.ToolCallID) {
		// Certainly valid: what the API's parser would read back from its
		// JSON, with no violation.
		return l.consume(ctx, by, req, raw)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return protocol.ConsumeResult{}, fmt.Errorf("consume: encode: %w", err)
	}
	return l.consumeJSON(ctx, by, body)
}

// consumeJSON parses a consume as received over the API, once, for the core.
func (l *Ledger) consumeJSON(ctx context.Context, by *protocol.Caller, body []byte) (protocol.ConsumeResult, error) {
	req, vs := protocol.ParseConsumeRequest(body)
	raw := func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", nil, body) }
	if len(vs) > 0 {
		return protocol.ConsumeResult{}, l.reject(ctx, by, protocol.OpConsume, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeBadRequest, vs, "invalid consume: %d violation(s)", len(vs)), raw())
	}
	return l.consume(ctx, by, req, raw)
}

// consume is the one core of a consume, typed or received: req is valid,
// raw is the request a refusal records.
func (l *Ledger) consume(ctx context.Context, by *protocol.Caller, req protocol.ConsumeRequest, raw func() protocol.RejectedRequest) (protocol.ConsumeResult, error) {
	var vs protocol.Violations
	// A cached record may be behind (not yet woken): the report's stream
	// subject is read then, below.
	rec, _, err := l.recordCached(ctx, callKey(req.ProjectID, req.AgentTurnID, req.ToolCallID))
	if err != nil {
		return protocol.ConsumeResult{}, fmt.Errorf("consume %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
	}
	if rec == nil {
		vs.Add("body.tool_call_id", protocol.VNotFound, "no call %s in turn %s was dispatched through the ledger", req.ToolCallID, req.AgentTurnID)
		return protocol.ConsumeResult{}, l.reject(ctx, by, protocol.OpConsume, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeUnknownCall, vs, "unknown call %s", req.ToolCallID), raw())
	}
	if rec.AgentID != req.AgentID {
		vs.Add("body.agent_id", protocol.VMismatch, "call %s belongs to agent %q, not %q", rec.ToolCallID, rec.AgentID, req.AgentID)
		return protocol.ConsumeResult{}, l.reject(ctx, by, protocol.OpConsume, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeMismatch, vs, "call %s is not agent %s's", rec.ToolCallID, req.AgentID), raw())
	}
	reportSeq := uint64(0)
	if rec.Claim != nil {
		reportSeq = rec.Claim.Seq
	}
	if reportSeq == 0 {
		// The report may be stored while the record is not yet marked.
		m, err := l.lastForSubject(ctx, protocol.ReportSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
		if err != nil {
			return protocol.ConsumeResult{}, fmt.Errorf("consume %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
		}
		if m != nil {
			reportSeq = m.Sequence
		}
	}
	if reportSeq == 0 {
		vs.Add("body.tool_call_id", "not_reported", "call %s has no accepted report yet", rec.ToolCallID)
		return protocol.ConsumeResult{}, l.reject(ctx, by, protocol.OpConsume, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeNotReported, vs, "call %s has not been reported", rec.ToolCallID), raw())
	}
	data, err := json.Marshal(protocol.ConsumedEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID,
		AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID, ReportSeq: reportSeq})
	if err != nil {
		return protocol.ConsumeResult{}, fmt.Errorf("consume: encode entry: %w", err)
	}
	subj := protocol.ConsumedSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	msg := &nats.Msg{Subject: subj, Data: data, Header: protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID}.Header()}
	msg.Header.Set(protocol.HeaderProjectID, rec.ProjectID)
	msg.Header.Set(protocol.HeaderChannelID, rec.ChannelID)
	ack, err := l.appendEntry(ctx, by, protocol.KindConsumed, msg, jetstream.WithExpectLastSequencePerSubject(0))
	if err == nil {
		return protocol.ConsumeResult{Seq: ack.Sequence, ReportSeq: reportSeq}, nil
	}
	if !isWrongLastSeq(err) {
		return protocol.ConsumeResult{}, fmt.Errorf("consume %s/%s: append: %w", req.AgentTurnID, req.ToolCallID, err)
	}
	existing, gerr := l.storedEntry(ctx, subj)
	if gerr != nil {
		return protocol.ConsumeResult{}, fmt.Errorf("consume %s/%s: consumed entry exists but cannot be read: %w", req.AgentTurnID, req.ToolCallID, gerr)
	}
	return protocol.ConsumeResult{Seq: existing.Sequence, ReportSeq: reportSeq, Duplicate: true}, nil
}
