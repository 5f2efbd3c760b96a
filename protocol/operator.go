package protocol

import (
	"maps"
	"slices"
	"strings"
)

// Operator actions (docs/operations.md, "Operator actions"): what an admin
// does to calls of its project, each recorded as an entry carrying the
// admin's actor token (CG-Actor) and a required reason, and refused with
// every violation listed (and recorded) when it makes no sense.

// Operator operations (admin only).
const (
	// OpCallCancel is the operator's cancel of any agent's call: the same
	// cancel entry as a worker's cancel, or, for a held call, the approval
	// decision canceled.
	OpCallCancel = "call.cancel"
	// OpCallResolve records what became of an outcome_unknown call's side
	// effect (a resolution entry); it changes no report.
	OpCallResolve = "call.resolve"
)

// KindResolution is the entry kind of an operator's resolution of a call
// whose report is failed with CodeToolOutcomeUnknown. One per call, on
// ResolutionSubject.
const KindResolution EntryKind = "resolution"

// MaxOperatorReasonBytes bounds an operator action's reason.
const MaxOperatorReasonBytes = 1024

// Effects a resolution states.
const (
	// EffectApplied: the call's side effect took place.
	EffectApplied = "applied"
	// EffectNotApplied: it did not.
	EffectNotApplied = "not_applied"
)

// ResolutionSubject builds cg.<ver>.<project>.<channel>.ledger.resolution.<agent_turn_id>.<tool_call_id>.
func ResolutionSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectResolution, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// OperatorCancelRequest is the body of call.cancel.
type OperatorCancelRequest struct {
	ProjectID   string `json:"project_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	Reason      string `json:"reason"`
}

// OperatorCancelResult is the answer of call.cancel.
type OperatorCancelResult struct {
	// Seq is the entry that canceled the call: a cancel entry, or the
	// approval entry of a held call (Entry says which).
	Seq uint64 `json:"seq"`
	// Entry is KindCancel or KindApproval.
	Entry EntryKind `json:"entry"`
	// Duplicate: the call was canceled already (by this or an earlier
	// cancel, the operator's or the worker's); Seq is that entry's.
	Duplicate bool `json:"duplicate"`
}

// ResolveRequest is the body of call.resolve.
type ResolveRequest struct {
	ProjectID   string `json:"project_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	// Effect is EffectApplied or EffectNotApplied.
	Effect string `json:"effect"`
	Reason string `json:"reason"`
}

// ResolveResult is the answer of call.resolve.
type ResolveResult struct {
	// Seq is the resolution entry's sequence.
	Seq    uint64 `json:"seq"`
	Effect string `json:"effect"`
}

// ResolutionEntry is the data of a resolution entry (and the resolution
// call.get shows in CallView.Resolution).
type ResolutionEntry struct {
	ProjectID   string `json:"project_id"`
	ChannelID   string `json:"channel_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	TurnEpoch   uint64 `json:"turn_epoch"`
	ToolCallID  string `json:"tool_call_id"`
	ToolName    string `json:"tool_name,omitempty"`
	// Effect is EffectApplied or EffectNotApplied.
	Effect string `json:"effect"`
	// Actor is the admin's actor token (the entry's CG-Actor).
	Actor  string `json:"actor"`
	Reason string `json:"reason"`
	// ReportSeq and ToolResultCardID are the outcome_unknown report the
	// resolution is about, which it leaves as it is.
	ReportSeq        uint64 `json:"report_seq"`
	ToolResultCardID string `json:"tool_result_card_id"`
	ResolvedUnixMS   int64  `json:"resolved_unix_ms"`
	// Seq is the entry's own sequence: set by call.get, never stored.
	Seq uint64 `json:"seq,omitempty"`
}

// ParseOperatorCancelRequest reads a call.cancel body, listing every
// violation.
func ParseOperatorCancelRequest(body []byte) (OperatorCancelRequest, Violations) {
	var vs Violations
	var r OperatorCancelRequest
	o, ok := ParseObject("body", body, &vs)
	if !ok {
		return r, vs
	}
	r.ProjectID, r.AgentTurnID, r.ToolCallID = o.Ident("project_id", true), o.Ident("agent_turn_id", true), o.Ident("tool_call_id", true)
	r.Reason = operatorReason(o)
	onlyMembers(o, OpCallCancel, RequestMembers(OpCallCancel)...)
	return r, vs
}

// ParseResolveRequest reads a call.resolve body, listing every violation.
func ParseResolveRequest(body []byte) (ResolveRequest, Violations) {
	var vs Violations
	var r ResolveRequest
	o, ok := ParseObject("body", body, &vs)
	if !ok {
		return r, vs
	}
	r.ProjectID, r.AgentTurnID, r.ToolCallID = o.Ident("project_id", true), o.Ident("agent_turn_id", true), o.Ident("tool_call_id", true)
	r.Effect = o.Str("effect", true)
	if r.Effect != "" && r.Effect != EffectApplied && r.Effect != EffectNotApplied {
		vs.Add(o.Path("effect"), VInvalidValue, "must be %s or %s, got %q", EffectApplied, EffectNotApplied, Clip(r.Effect))
	}
	r.Reason = operatorReason(o)
	onlyMembers(o, OpCallResolve, RequestMembers(OpCallResolve)...)
	return r, vs
}

// operatorReason reads an operator action's reason: required, at most
// MaxOperatorReasonBytes.
func operatorReason(o JSONObject) string {
	s := o.Str("reason", true)
	if len(s) > MaxOperatorReasonBytes {
		o.vs.Add(o.Path("reason"), VTooLarge, "is %d bytes; the limit is %d", len(s), MaxOperatorReasonBytes)
	}
	return s
}

// requestMembers are the body members of the requests on one call that
// an HTTP API also takes (its path naming the call).
var requestMembers = map[string][]string{
	OpCallCancel:  {"project_id", "agent_turn_id", "tool_call_id", "reason"},
	OpCallResolve: {"project_id", "agent_turn_id", "tool_call_id", "effect", "reason"},
	OpCallRedrive: {"project_id", "agent_turn_id", "tool_call_id", "reason"},
	OpApprove:     {"project_id", "agent_turn_id", "tool_call_id", "tool_call_card_id", "arguments_digest", "reason"},
	OpDeny:        {"project_id", "agent_turn_id", "tool_call_id", "tool_call_card_id", "arguments_digest", "reason"},
}

// RequestMembers are the members a body of op takes (call.cancel,
// call.resolve, call.redrive, approve, deny; nil for any other op), so an
// HTTP API that takes some of them from its path can name the rest.
func RequestMembers(op string) []string {
	return slices.Clone(requestMembers[op])
}

// onlyMembers refuses every member of o not named, naming those it takes:
// an operator's typo (say "efect") must not pass for an absent field.
func onlyMembers(o JSONObject, op string, names ...string) {
	for _, k := range slices.Sorted(maps.Keys(o.fields)) {
		if !slices.Contains(names, k) {
			o.vs.Add(o.Path(k), VInvalidValue, "is not a member of a %s body (%s)", op, strings.Join(names, ", "))
		}
	}
}
