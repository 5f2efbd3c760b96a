package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The parsers of the ledger's read requests (and projector.skip): each
// reads its body once and lists every violation; the ledger answers a
// request with any bad_request, recording nothing (a read writes nothing).

// MaxCardIDs bounds the card ids of one card.get.
const MaxCardIDs = 256

// CardGetRequest is the body of card.get.
type CardGetRequest struct {
	ProjectID string   `json:"project_id"`
	CardIDs   []string `json:"card_ids"`
}

// ParseCardGetRequest reads a card.get body, listing every violation.
func ParseCardGetRequest(body []byte) (CardGetRequest, Violations) {
	var vs Violations
	var r CardGetRequest
	o, ok := ParseObject("body", body, &vs)
	if !ok {
		return r, vs
	}
	r.ProjectID = o.Ident("project_id", true)
	if raw := o.Raw("card_ids"); raw == nil {
		vs.Add("body.card_ids", VRequired, "is required")
	} else if err := json.Unmarshal(raw, &r.CardIDs); err != nil {
		vs.Add("body.card_ids", VInvalidType, "must be an array of strings")
	}
	for i, id := range r.CardIDs {
		CheckIdent(&vs, fmt.Sprintf("body.card_ids[%d]", i), id, true)
	}
	if raw := o.Raw("card_ids"); raw != nil && len(r.CardIDs) == 0 && len(vs) == 0 {
		vs.Add("body.card_ids", VEmpty, "at least one card id is required")
	}
	if len(r.CardIDs) > MaxCardIDs {
		vs.Add("body.card_ids", VTooLarge, "at most %d card ids per request, got %d", MaxCardIDs, len(r.CardIDs))
	}
	return r, vs
}

// RosterGetRequest is the body of roster.get.
type RosterGetRequest struct {
	ProjectID string `json:"project_id"`
	AgentID   string `json:"agent_id"`
}

// ParseRosterGetRequest reads a roster.get body, listing every violation.
func ParseRosterGetRequest(body []byte) (RosterGetRequest, Violations) {
	var vs Violations
	var r RosterGetRequest
	if o, ok := ParseObject("body", body, &vs); ok {
		r.ProjectID, r.AgentID = o.Ident("project_id", true), o.Ident("agent_id", true)
	}
	return r, vs
}

// CallGetRequest is the body of call.get.
type CallGetRequest struct {
	ProjectID   string `json:"project_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	// TwoPhase asks for the call's two-phase state too (two more reads).
	TwoPhase bool `json:"two_phase,omitempty"`
}

// ParseCallGetRequest reads a call.get body, listing every violation.
func ParseCallGetRequest(body []byte) (CallGetRequest, Violations) {
	var vs Violations
	var r CallGetRequest
	if o, ok := ParseObject("body", body, &vs); ok {
		r.ProjectID, r.AgentTurnID, r.ToolCallID = o.Ident("project_id", true), o.Ident("agent_turn_id", true), o.Ident("tool_call_id", true)
		r.TwoPhase = string(o.Raw("two_phase")) == "true"
		if raw := o.Raw("two_phase"); raw != nil && !r.TwoPhase && string(raw) != "false" {
			vs.Add(o.Path("two_phase"), VInvalidType, "must be a boolean")
		}
	}
	return r, vs
}

// ParseCancelGetRequest reads a cancel.get body (the call, with its
// channel, which the cancel subject holds), listing every violation.
func ParseCancelGetRequest(body []byte) (CallRef, Violations) {
	var vs Violations
	var r CallRef
	if o, ok := ParseObject("body", body, &vs); ok {
		r = CallRef{ProjectID: o.Ident("project_id", true), ChannelID: o.Ident("channel_id", true),
			AgentTurnID: o.Ident("agent_turn_id", true), ToolCallID: o.Ident("tool_call_id", true)}
	}
	return r, vs
}

// ToolGetRequest is the body of tool.get.
type ToolGetRequest struct {
	ProjectID string `json:"project_id"`
	ToolName  string `json:"tool_name"`
	// Seq, when not zero, asks for the definition stored at that sequence
	// (a call's pin) rather than the current one.
	Seq uint64 `json:"seq,omitempty"`
}

// ParseToolGetRequest reads a tool.get body, listing every violation.
func ParseToolGetRequest(body []byte) (ToolGetRequest, Violations) {
	var vs Violations
	var r ToolGetRequest
	if o, ok := ParseObject("body", body, &vs); ok {
		r.ProjectID, r.ToolName = o.Ident("project_id", true), o.Ident("tool_name", true)
		if raw := o.Raw("seq"); raw != nil {
			if err := json.Unmarshal(raw, &r.Seq); err != nil || r.Seq == 0 {
				vs.Add(o.Path("seq"), VInvalidType, "must be a positive integer (the sequence of the tool's definition entry)")
			}
		}
	}
	return r, vs
}

// ParseToolListRequest reads a tool.list body (the project), listing every
// violation.
func ParseToolListRequest(body []byte) (string, Violations) {
	var vs Violations
	var project string
	if o, ok := ParseObject("body", body, &vs); ok {
		project = o.Ident("project_id", true)
	}
	return project, vs
}

// ParseToolConsumerRequest reads a tool.consumer body, which names nothing
// (the subject does) but must be the documented object when sent; an
// empty body is the same as {}.
func ParseToolConsumerRequest(body []byte) Violations {
	var vs Violations
	if len(bytes.TrimSpace(body)) > 0 {
		ParseObject("body", body, &vs)
	}
	return vs
}

// ParseSkipRequest reads a projector.skip body, listing every violation.
func ParseSkipRequest(body []byte) (SkipRequest, Violations) {
	var vs Violations
	var r SkipRequest
	if o, ok := ParseObject("body", body, &vs); ok {
		if raw := o.Raw("seq"); raw == nil {
			vs.Add("body.seq", VRequired, "is required")
		} else if err := json.Unmarshal(raw, &r.Seq); err != nil {
			vs.Add("body.seq", VInvalidType, "must be a positive integer")
		}
		r.Reason = o.Str("reason", true)
	}
	return r, vs
}
