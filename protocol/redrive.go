package protocol

import (
	"strconv"
	"strings"
)

// Redrive (docs/operations.md, "Redrive"): an admin runs a failed call
// again as a new call derived from it, under the same identity: the same
// agent, turn, epoch, tool, arguments and idempotency key, with the
// tool_call_id <root>~r<n>. The failed call keeps its one report; the
// derived call gets its own, and wakes the same agent.

// OpCallRedrive runs a failed or timed-out call again as a derived call
// (admin only).
const OpCallRedrive = "call.redrive"

// KindRedrive is the entry kind of an operator's redrive: one per call, on
// RedriveSubject, written before the derived call is dispatched.
const KindRedrive EntryKind = "redrive"

// RedriveSeparator joins a call's root id and its redrive number in a
// derived call's id (<root>~r<n>). Workers may not dispatch ids that end
// in it followed by digits (ReservedCallID).
const RedriveSeparator = "~r"

// RedriveSubject builds cg.<ver>.<project>.<channel>.ledger.redrive.<agent_turn_id>.<tool_call_id>.
func RedriveSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectRedrive, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// RedriveOrigin splits a derived call's id <root>~r<n> (n >= 1, decimal
// without leading zeros) into its root and n; ok is false for any other id.
func RedriveOrigin(callID string) (root string, n int, ok bool) {
	i := strings.LastIndex(callID, RedriveSeparator)
	if i <= 0 {
		return "", 0, false
	}
	digits := callID[i+len(RedriveSeparator):]
	if digits == "" || digits[0] == '0' || len(digits) > 9 {
		return "", 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return "", 0, false
		}
	}
	n, _ = strconv.Atoi(digits)
	return callID[:i], n, true
}

// ReservedCallID reports whether a worker may not dispatch callID: only the
// ledger's redrive creates ids of the form <root>~r<n>.
func ReservedCallID(callID string) bool {
	_, _, ok := RedriveOrigin(callID)
	return ok
}

// RedriveCallID is the id of the call a redrive of callID creates: the
// root's next number (x -> x~r1, x~r1 -> x~r2). ok is false when it would
// not be an identifier (longer than MaxIdentifierLen).
func RedriveCallID(callID string) (string, bool) {
	root, n, ok := RedriveOrigin(callID)
	if !ok {
		root = callID
	}
	id := root + RedriveSeparator + strconv.Itoa(n+1)
	return id, ValidIdentifier(id)
}

// RedrivenFrom is the call a derived call was redriven from (x~r1 -> x,
// x~r2 -> x~r1); ok is false for a call that is not derived.
func RedrivenFrom(callID string) (string, bool) {
	root, n, ok := RedriveOrigin(callID)
	switch {
	case !ok:
		return "", false
	case n == 1:
		return root, true
	default:
		return root + RedriveSeparator + strconv.Itoa(n-1), true
	}
}

// RedriveRequest is the body of call.redrive.
type RedriveRequest struct {
	ProjectID   string `json:"project_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	Reason      string `json:"reason"`
}

// RedriveResult is the answer of call.redrive.
type RedriveResult struct {
	// Seq is the redrive entry's sequence.
	Seq uint64 `json:"seq"`
	// RedriveCallID and RedriveCardID name the derived call and its
	// tool.call card.
	RedriveCallID string `json:"redrive_call_id"`
	RedriveCardID string `json:"redrive_card_id"`
	// Dispatch is the derived call's dispatch answer.
	Dispatch DispatchResult `json:"dispatch"`
	// Duplicate: this redrive was stored already (the same actor and
	// reason sent it again); Seq is the stored entry's.
	Duplicate bool `json:"duplicate"`
}

// RedriveEntry is the data of a redrive entry (and what call.get shows in
// CallView.Redrive). It carries the derived call's whole dispatch, so
// whoever finishes it (the operator's request, or serve's keeper after a
// crash) dispatches exactly what was decided.
type RedriveEntry struct {
	ProjectID   string `json:"project_id"`
	ChannelID   string `json:"channel_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	TurnEpoch   uint64 `json:"turn_epoch"`
	// ToolCallID is the call redriven; RedriveCallID the derived call.
	ToolCallID    string `json:"tool_call_id"`
	RedriveCallID string `json:"redrive_call_id"`
	RedriveCardID string `json:"redrive_card_id"`
	ToolName      string `json:"tool_name,omitempty"`
	// IdempotencyKey is shared by the call and the derived call.
	IdempotencyKey string `json:"idempotency_key"`
	Actor          string `json:"actor"`
	Reason         string `json:"reason"`
	// ReportSeq and Status are the redriven call's report; ResolutionSeq
	// its resolution (not_applied), when the redrive needed one.
	ReportSeq     uint64 `json:"report_seq"`
	Status        string `json:"status"`
	TaxonomyCode  string `json:"taxonomy_code,omitempty"`
	ResolutionSeq uint64 `json:"resolution_seq,omitempty"`
	// Determinism is the tool's, as the redrive judged it.
	Determinism    string `json:"determinism"`
	RedrivenUnixMS int64  `json:"redriven_unix_ms"`
	// Dispatch is the derived call's dispatch: subject, identity headers,
	// card and payload, as a worker's dispatch would carry them.
	Dispatch RedriveDispatch `json:"dispatch"`
	// Seq is the entry's own sequence: set by call.get, never stored.
	Seq uint64 `json:"seq,omitempty"`
}

// RedriveDispatch is the dispatch a redrive entry stores.
type RedriveDispatch struct {
	Subject string              `json:"subject"`
	Header  map[string][]string `json:"header"`
	Card    Card                `json:"card"`
	Payload ToolCommandPayload  `json:"payload"`
	// Approval is the original call's own ask for approval, if it made one.
	Approval *DispatchApproval `json:"approval,omitempty"`
}

// ParseRedriveRequest reads a call.redrive body, listing every violation.
func ParseRedriveRequest(body []byte) (RedriveRequest, Violations) {
	var vs Violations
	var r RedriveRequest
	o, ok := ParseObject("body", body, &vs)
	if !ok {
		return r, vs
	}
	r.ProjectID, r.AgentTurnID, r.ToolCallID = o.Ident("project_id", true), o.Ident("agent_turn_id", true), o.Ident("tool_call_id", true)
	r.Reason = operatorReason(o)
	onlyMembers(o, OpCallRedrive, RequestMembers(OpCallRedrive)...)
	return r, vs
}
