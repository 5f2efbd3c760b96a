package protocol

import (
	"encoding/json"

	"github.com/nats-io/nats.go"
)

// ParseDispatchBody reads a dispatch API request's body: the subject, the
// card and the payload as the bytes they were sent as (each checked by
// CheckDispatch as a document of its own, so their violations carry the
// documented card.* and payload.* paths), the approval and the checks. ok
// is false when the body is not a JSON object: nothing else is read then.
// A body that repeats a key has a violation and is read through, so a
// refusal lists every problem.
func ParseDispatchBody(body []byte) (b DispatchBody, vs Violations, ok bool) {
	o, ok := ParseObject("body", body, &vs, "card", "payload")
	if !ok {
		return b, vs, false
	}
	b.Subject = o.Str("subject", true)
	b.Card = o.Raw("card")
	b.Payload = o.Raw("payload")
	b.Approval = ParseDispatchApproval(o, &vs)
	b.Checks = ParseDispatchChecks(o, &vs)
	return b, vs, true
}

// DispatchParts is a dispatch for CheckDispatch: its parts as received
// (bytes), or typed where the caller holds them already known valid.
type DispatchParts struct {
	// Version is the protocol version the ledger serves: the subject's
	// must be it.
	Version string
	Subject string
	// Header holds the call's identity (CG-* headers), read unless
	// Identity is given.
	Header nats.Header
	// Card and Payload are the card and the command payload as JSON.
	Card, Payload []byte
	// Identity, when set, is the identity Header holds, known valid (a
	// PMO command's still needs its step id).
	Identity *Identity
	// TypedPayload, when set, is the payload (Payload is then nil), known
	// valid (a PMO command's still needs its tool_name, the subject's).
	TypedPayload *ToolCommandPayload
	// Redrive is the ledger's own dispatch of a redrive's derived call, the
	// only one that may use a reserved id (ReservedCallID).
	Redrive bool
}

// CheckedDispatch is a dispatch's parts read and checked together.
type CheckedDispatch struct {
	Subject  Subject
	Identity Identity
	Payload  ToolCommandPayload
	// Card is nil when the card does not read; CardBytes is its stored
	// encoding (nil when the decoder could not encode it).
	Card      *Card
	CardBytes []byte
}

// CheckDispatch reads and checks a dispatch's subject, identity, payload
// and card, and that they agree, adding every violation to vs in the
// documented order: subject, headers, payload, card, their agreement.
func CheckDispatch(p DispatchParts, vs *Violations) CheckedDispatch {
	var d CheckedDispatch
	subject := p.Subject
	sub := DecodeSubject(subject, vs)
	if sub.Kind != SubjectUnknown && !sub.IsCommand() {
		vs.Add("subject", VInvalidSubject, "%q is a %s subject, not a tool or PMO command subject", Clip(subject), sub.Kind)
	} else if IsDecisionSubject(sub) {
		// The ledger's own: a prepared call's decision is stored there.
		vs.Add("subject", VInvalidSubject, "%q has the shape of a two-phase decision (cmd.tool.<tool>.decision.<turn>.<call>), which only the ledger writes", Clip(subject))
	}
	if sub.Kind != SubjectUnknown && sub.Version != p.Version {
		vs.Add("subject", VInvalidSubject, "protocol version %q is not served here (this ledger serves %q)", sub.Version, p.Version)
	}
	pmo := sub.Kind == SubjectPMOCommand
	var id Identity
	var hvs Violations
	if p.Identity != nil && (!pmo || p.Identity.StepID != "") {
		id = *p.Identity
	} else {
		id, hvs = ParseIdentity(p.Header, IdentityRules{RequireToolCallID: true, RequireStepID: pmo})
	}
	*vs = append(*vs, hvs...)
	if ReservedCallID(id.ToolCallID) && !p.Redrive {
		// <root>~r<n> is a redrive's derived call, which only the ledger
		// creates: it shares the root's idempotency key.
		vs.Add("header."+HeaderToolCallID, VInvalidToken, "%q ends in %s followed by digits, which is reserved for the derived calls of call.redrive", id.ToolCallID, RedriveSeparator)
	}
	var payload ToolCommandPayload
	if tp := p.TypedPayload; tp != nil && (!pmo || (tp.ToolName != "" && (sub.Tool == "" || tp.ToolName == sub.Tool))) {
		payload = *tp
	} else {
		payloadJSON := p.Payload
		if tp != nil {
			// Strings and integers: the encoding cannot fail.
			payloadJSON, _ = json.Marshal(tp)
		}
		payload = DecodeCommandPayload(payloadJSON, sub, id, hvs, vs)
	}
	card, cardBytes := DecodeCardStored("card", p.Card, vs)
	if card != nil {
		crossCheckDispatch(card, sub, id, &payload, vs)
		if ReservedCallID(card.CardID) && !p.Redrive {
			// A redrive names its derived call's card <card>~r<n>: a worker's
			// card under such an id would stand in the redrive's way.
			vs.Add("card.card_id", VInvalidToken, "%q ends in %s followed by digits, which is reserved for the tool.call cards of call.redrive's derived calls", card.CardID, RedriveSeparator)
		}
	}
	if payload.DeadlineUnixMS != 0 {
		vs.Add("payload.deadline_unix_ms", VForbidden, "the ledger sets the deadline at dispatch from timeout_ms (or the tool's timeout_ms_default); a dispatch must not carry one")
	}
	d.Subject, d.Identity, d.Payload, d.Card, d.CardBytes = sub, id, payload, card, cardBytes
	return d
}

// crossCheckDispatch checks that card, subject, identity and payload agree.
func crossCheckDispatch(c *Card, sub Subject, id Identity, p *ToolCommandPayload, vs *Violations) {
	if c.Type != "" && c.Type != CardToolCall {
		vs.Add("card.type", VInvalidValue, "a dispatch needs a %s card, got %q", CardToolCall, c.Type)
	}
	if p.ToolCallCardID != "" && c.CardID != "" && p.ToolCallCardID != c.CardID {
		vs.Add("payload.tool_call_card_id", VMismatch, "must equal card.card_id (%q), got %q", c.CardID, p.ToolCallCardID)
	}
	if sub.Project != "" && c.ProjectID != "" && sub.Project != c.ProjectID {
		vs.Add("card.project_id", VMismatch, "must equal the subject's project_id (%q), got %q", sub.Project, c.ProjectID)
	}
	if id.AgentTurnID != "" && c.AgentTurnID != "" && id.AgentTurnID != c.AgentTurnID {
		vs.Add("card.agent_turn_id", VMismatch, "must equal header %s (%q), got %q", HeaderAgentTurnID, id.AgentTurnID, c.AgentTurnID)
	}
	if id.ToolCallID != "" && c.ToolCallID != "" && id.ToolCallID != c.ToolCallID {
		vs.Add("card.tool_call_id", VMismatch, "must equal header %s (%q), got %q", HeaderToolCallID, id.ToolCallID, c.ToolCallID)
	}
	if c.Type != CardToolCall || len(c.Content) == 0 {
		return
	}
	tc, err := c.ToolCall()
	if err != nil {
		return
	}
	switch {
	case p.ToolName == "":
		p.ToolName = tc.ToolName
	case tc.ToolName != "" && p.ToolName != tc.ToolName:
		vs.Add("payload.tool_name", VMismatch, "must equal card.content.tool_name (%q), got %q", tc.ToolName, p.ToolName)
	}
}

// ParseDispatch reads and checks a dispatch API request as the ledger that
// serves version does (ParseDispatchBody, then CheckDispatch), listing
// every violation: the request's grammar, without what only the ledger's
// state answers (the checks asked for, a repeat of a call).
func ParseDispatch(version string, h nats.Header, body []byte) (DispatchBody, CheckedDispatch, Violations) {
	b, vs, ok := ParseDispatchBody(body)
	if !ok {
		return b, CheckedDispatch{}, vs
	}
	d := CheckDispatch(DispatchParts{Version: version, Subject: b.Subject, Header: h, Card: b.Card, Payload: b.Payload}, &vs)
	return b, d, vs
}
