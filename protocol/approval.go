package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Approvals (docs/approvals.md): a call to a tool whose definition requires
// approval, or dispatched asking for one, is held: the ledger records it
// (a held entry, call state StateAwaitingApproval) and publishes its command
// only once an approver approved exactly that call's tool.call card. A
// denial, the approval's expiry or a cancel ends the call instead. One
// decision per call: its entry's subject is the call's own and must be empty.

// KindHeld is the entry kind of a held call: the command the ledger will
// publish on approval, and who may approve it until when. One per call, on
// HeldSubject.
const KindHeld EntryKind = "held"

// KindApproval is the entry kind of a held call's decision: approved,
// denied, expired or canceled. One per call, on ApprovalSubject.
const KindApproval EntryKind = "approval"

// Approval operations. approve and deny are an approver's; approval.list
// and approval.get read the views (approver, auditor or admin).
const (
	OpApprove      = "approve"
	OpDeny         = "deny"
	OpApprovalList = "approval.list"
	OpApprovalGet  = "approval.get"
)

// StateAwaitingApproval is the call record state of a held call, before
// its decision (protocol.StateDispatched follows an approval).
const StateAwaitingApproval = "awaiting_approval"

// Decisions an approval entry records.
const (
	ApprovalApproved = "approved"
	ApprovalDenied   = "denied"
	ApprovalExpired  = "expired"
	ApprovalCanceled = "canceled"
)

// ApprovalPending is the state of a held call with no decision, as
// approval.list and approval.get show it (otherwise its decision).
const ApprovalPending = "pending"

// HeldForApproval is a held entry's reason when the call waits for an
// approval (HeldPaused when its tool is paused).
const HeldForApproval = "approval"

// ApprovalExpirySource is the approver named by an expiry decision, which
// the ledger itself takes when no approver decided in time.
const ApprovalExpirySource = "cgledger-approval-expiry"

// Taxonomy codes (seed 004 section 5) of the calls an approval ends.
const (
	// TaxonomyApprovalDenied: an approver denied the call (status failed,
	// error.code auth_failed).
	TaxonomyApprovalDenied = "A-APPROVAL-DENIED"
	// TaxonomyApprovalExpired: no approver decided before the approval's
	// timeout (status failed, error.code bad_request).
	TaxonomyApprovalExpired = "P-PRECOND-APPROVAL-EXPIRED"
)

// Limits of approvals.
const (
	// DefaultApprovalTimeoutMS is approval.timeout_ms's default: an hour.
	DefaultApprovalTimeoutMS = 3_600_000
	// MaxApprovalTimeoutMS bounds approval.timeout_ms: 7 days.
	MaxApprovalTimeoutMS = 7 * 24 * 3_600_000
	// MinApprovalTimeoutMS bounds approval.timeout_ms from below: a second.
	MinApprovalTimeoutMS = 1000
	// MaxApprovers bounds approval.approvers.
	MaxApprovers = 100
	// MaxApprovalReasonBytes bounds an approve or deny reason.
	MaxApprovalReasonBytes = 1024
)

// ToolApproval is a tool definition's approval settings.
type ToolApproval struct {
	// Required holds every call of the tool for approval.
	Required bool `json:"required"`
	// Approvers, when not empty, are the only approvers (their credential's
	// approver name) who may decide the tool's calls; empty means any
	// approver of the project.
	Approvers []string `json:"approvers,omitempty"`
	// TimeoutMS is how long a held call waits for a decision before it
	// expires; zero in a stored definition means DefaultApprovalTimeoutMS.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// AllowSelfApproval lets an approver decide a call whose agent_id is
	// their own approver name; false (the default) refuses it.
	AllowSelfApproval bool `json:"allow_self_approval,omitempty"`
}

// Timeout is the approval's timeout, its default filled in.
func (a *ToolApproval) Timeout() int64 {
	if a == nil || a.TimeoutMS == 0 {
		return DefaultApprovalTimeoutMS
	}
	return a.TimeoutMS
}

// MayApprove reports whether approver is among the listed approvers (or
// none is listed).
func (a *ToolApproval) MayApprove(approver string) bool {
	return a == nil || len(a.Approvers) == 0 || slices.Contains(a.Approvers, approver)
}

// parseToolApproval reads a definition's approval object, listing every
// violation.
func parseToolApproval(o JSONObject, vs *Violations) *ToolApproval {
	a := &ToolApproval{}
	if r := o.Raw("required"); r != nil && json.Unmarshal(r, &a.Required) != nil {
		vs.Add(o.Path("required"), VInvalidType, "must be true or false")
	}
	if r := o.Raw("allow_self_approval"); r != nil && json.Unmarshal(r, &a.AllowSelfApproval) != nil {
		vs.Add(o.Path("allow_self_approval"), VInvalidType, "must be true or false")
	}
	a.TimeoutMS = intField(o, "timeout_ms", MinApprovalTimeoutMS, MaxApprovalTimeoutMS)
	if r := o.Raw("approvers"); r != nil {
		var names []json.RawMessage
		if json.Unmarshal(r, &names) != nil {
			vs.Add(o.Path("approvers"), VInvalidType, "must be an array of approver names")
		} else {
			if len(names) > MaxApprovers {
				vs.Add(o.Path("approvers"), VTooLarge, "has %d names; the limit is %d", len(names), MaxApprovers)
			}
			seen := map[string]bool{}
			for i, raw := range names {
				path := fmt.Sprintf("%s[%d]", o.Path("approvers"), i)
				var n string
				switch {
				case json.Unmarshal(raw, &n) != nil:
					vs.Add(path, VInvalidType, "must be a string")
				case !ValidIdentifier(n):
					vs.Add(path, VInvalidToken, "%q is not an identifier (an approver name is one)", Clip(n))
				case seen[n]:
					vs.Add(path, VInvalidValue, "%q is listed twice", n)
				default:
					seen[n] = true
					a.Approvers = append(a.Approvers, n)
				}
			}
		}
	}
	return a
}

// DispatchApproval is a dispatch body's optional "approval": a worker asking
// that this one call be held for approval (the tool's definition may
// require it anyway).
type DispatchApproval struct {
	Required bool `json:"required"`
}

// ArgumentsDigest is the digest an approval names: "sha256:" and the hex
// SHA-256 of the tool.call card's content.arguments exactly as the ledger
// stores them (the card's normalized JSON), so an approver approves those
// bytes and nothing else.
func ArgumentsDigest(arguments json.RawMessage) string {
	sum := sha256.Sum256(arguments)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// HeldSubject builds cg.<ver>.<project>.<channel>.ledger.held.<agent_turn_id>.<tool_call_id>.
func HeldSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectHeld, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// ApprovalSubject builds cg.<ver>.<project>.<channel>.ledger.approval.<agent_turn_id>.<tool_call_id>.
func ApprovalSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectApproval, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// HeldEntry is the data of a held entry.
type HeldEntry struct {
	ProjectID      string `json:"project_id"`
	ChannelID      string `json:"channel_id"`
	AgentID        string `json:"agent_id"`
	AgentTurnID    string `json:"agent_turn_id"`
	TurnEpoch      uint64 `json:"turn_epoch"`
	ToolCallID     string `json:"tool_call_id"`
	StepID         string `json:"step_id,omitempty"`
	ToolName       string `json:"tool_name"`
	ToolCallCardID string `json:"tool_call_card_id"`
	// ArgumentsDigest is ArgumentsDigest of the card's arguments.
	ArgumentsDigest string `json:"arguments_digest"`
	// Reason is HeldForApproval or HeldPaused.
	Reason string `json:"reason"`
	// RequestedBy says who asked for the approval: "definition" (the
	// tool's approval.required) or "worker" (the dispatch's approval).
	RequestedBy string `json:"requested_by"`
	// Approvers and AllowSelfApproval are the tool's, as pinned at
	// dispatch (empty approvers: any approver of the project).
	Approvers         []string `json:"approvers,omitempty"`
	AllowSelfApproval bool     `json:"allow_self_approval,omitempty"`
	// ExpiresUnixMS is when the ledger decides expired if no approver has
	// decided.
	ExpiresUnixMS int64 `json:"expires_unix_ms"`
	// CommandSubject is the subject the command is published on when the
	// call is approved.
	CommandSubject string `json:"command_subject"`
	// BudgetMS is the call's time budget: on approval its deadline is the
	// decision's time plus this.
	BudgetMS int64 `json:"budget_ms"`
	// DeadlineUnixMS is, for a HeldPaused hold, the call's deadline (fixed
	// at dispatch, or at its approval): the deadline keeper times the call
	// out then if no resume released it.
	DeadlineUnixMS int64 `json:"deadline_unix_ms,omitempty"`
	// PauseSeq is, for a HeldPaused hold, the sequence of the pause entry
	// that held the call.
	PauseSeq uint64 `json:"pause_seq,omitempty"`
}

// Who asked for an approval (HeldEntry.RequestedBy).
const (
	ApprovalRequestedByDefinition = "definition"
	ApprovalRequestedByWorker     = "worker"
)

// ApprovalEntry is the data of an approval (decision) entry.
type ApprovalEntry struct {
	ProjectID       string `json:"project_id"`
	ChannelID       string `json:"channel_id"`
	AgentID         string `json:"agent_id"`
	AgentTurnID     string `json:"agent_turn_id"`
	TurnEpoch       uint64 `json:"turn_epoch"`
	ToolCallID      string `json:"tool_call_id"`
	ToolName        string `json:"tool_name"`
	ToolCallCardID  string `json:"tool_call_card_id"`
	ArgumentsDigest string `json:"arguments_digest"`
	// Decision is ApprovalApproved, ApprovalDenied, ApprovalExpired or
	// ApprovalCanceled.
	Decision string `json:"decision"`
	// Approver is the deciding approver's name; ApprovalExpirySource for
	// an expiry; the agent for its cancel, the operator's actor for an
	// operator's (call.cancel).
	Approver string `json:"approver"`
	Reason   string `json:"reason,omitempty"`
	// DecidedUnixMS is the decision's time: an approved call's deadline is
	// this plus the held entry's budget_ms.
	DecidedUnixMS int64  `json:"decided_unix_ms"`
	HeldSeq       uint64 `json:"held_seq"`
}

// ApprovalRequest is the body of approve and deny: the approver names the
// exact card, and the digest of its arguments, they decide on.
type ApprovalRequest struct {
	ProjectID       string `json:"project_id"`
	AgentTurnID     string `json:"agent_turn_id"`
	ToolCallID      string `json:"tool_call_id"`
	ToolCallCardID  string `json:"tool_call_card_id"`
	ArgumentsDigest string `json:"arguments_digest"`
	Reason          string `json:"reason,omitempty"`
}

// ApprovalResult is the answer of approve and deny.
type ApprovalResult struct {
	// Seq is the approval entry's sequence.
	Seq      uint64 `json:"seq"`
	Decision string `json:"decision"`
	// CommandSeq is the released command's sequence (approve only).
	CommandSeq uint64 `json:"command_seq,omitempty"`
	// DeadlineUnixMS is the approved call's deadline (approve only).
	DeadlineUnixMS int64 `json:"deadline_unix_ms,omitempty"`
	// ReportSeq is the ending report's sequence (deny only).
	ReportSeq uint64 `json:"report_seq,omitempty"`
}

// ParseApprovalRequest reads an approve or deny body, listing every
// violation.
func ParseApprovalRequest(body []byte) (ApprovalRequest, Violations) {
	var vs Violations
	var r ApprovalRequest
	o, ok := ParseObject("body", body, &vs)
	if !ok {
		return r, vs
	}
	r.ProjectID, r.AgentTurnID, r.ToolCallID = o.Ident("project_id", true), o.Ident("agent_turn_id", true), o.Ident("tool_call_id", true)
	r.ToolCallCardID = o.Ident("tool_call_card_id", true)
	r.ArgumentsDigest = o.Str("arguments_digest", true)
	if d := r.ArgumentsDigest; d != "" && !validDigest(d) {
		vs.Add(o.Path("arguments_digest"), VInvalidValue, "must be \"sha256:\" and 64 lowercase hex digits, got %q", Clip(d))
	}
	r.Reason = o.Str("reason", false)
	if len(r.Reason) > MaxApprovalReasonBytes {
		vs.Add(o.Path("reason"), VTooLarge, "is %d bytes; the limit is %d", len(r.Reason), MaxApprovalReasonBytes)
	}
	// A member the decision does not take (a misspelt digest, an
	// "approver" claiming another name) is refused, as for every operator
	// action, rather than dropped in silence.
	onlyMembers(o, "approve or deny", RequestMembers(OpApprove)...)
	return r, vs
}

// ValidArgumentsDigest reports whether d has the form of an
// ArgumentsDigest ("sha256:" and 64 lowercase hex digits), as
// ParseApprovalRequest requires.
func ValidArgumentsDigest(d string) bool { return validDigest(d) }

// validDigest reports whether d has the form of an ArgumentsDigest.
func validDigest(d string) bool {
	const prefix = "sha256:"
	if len(d) != len(prefix)+64 || d[:len(prefix)] != prefix {
		return false
	}
	for _, c := range d[len(prefix):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ParseDispatchApproval reads a dispatch body's optional "approval" object
// ({"required": bool}), listing every violation; nil when absent.
func ParseDispatchApproval(o JSONObject, vs *Violations) *DispatchApproval {
	ao, ok := o.Object("approval", false)
	if !ok {
		return nil
	}
	a := &DispatchApproval{}
	switch r := ao.Raw("required"); {
	case r == nil:
		vs.Add(ao.Path("required"), VRequired, "is required (true holds the call for approval)")
	case json.Unmarshal(r, &a.Required) != nil:
		vs.Add(ao.Path("required"), VInvalidType, "must be true or false")
	}
	for _, k := range slices.Sorted(maps.Keys(ao.fields)) {
		if k != "required" {
			vs.Add(ao.Path(k), VInvalidValue, "is not a member of approval (only \"required\")")
		}
	}
	return a
}
