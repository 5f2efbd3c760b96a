package protocol

import (
	"encoding/json"
	"time"
)

// Approval reads (approval.list, approval.get): answered by the views
// (docs/protocol.md#approvallist), for an approver, auditor or admin of the
// project. Their bodies are parsed by the projector, which checks a cursor
// against the listing it continues.

// Approval listing states (ApprovalListRequest.State): the held calls with
// no decision (ApprovalPending), the decided ones, or both.
const (
	ApprovalListDecided = "decided"
	ApprovalListAll     = "all"
)

// ApprovalListRequest is the body of approval.list: one page of the
// project's held calls in the order they were held (oldest first). State is
// pending (the default), decided or all; Cursor is the NextCursor of the page
// before (empty for the first); Limit 0 means the default page size.
type ApprovalListRequest struct {
	ProjectID string `json:"project_id"`
	State     string `json:"state,omitempty"`
	Cursor    string `json:"cursor,omitempty"`
	Limit     int    `json:"limit,omitempty"`
}

// ApprovalGetRequest is the body of approval.get: one held call.
type ApprovalGetRequest struct {
	ProjectID   string `json:"project_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
}

// ApprovalItem is a held call as approval.list and approval.get show it:
// what the held entry pinned, the arguments of its tool.call card (the
// bytes ArgumentsDigest covers), and its decision once there is one.
type ApprovalItem struct {
	ProjectID      string `json:"project_id"`
	ChannelID      string `json:"channel_id"`
	AgentID        string `json:"agent_id"`
	AgentTurnID    string `json:"agent_turn_id"`
	ToolCallID     string `json:"tool_call_id"`
	ToolName       string `json:"tool_name"`
	ToolCallCardID string `json:"tool_call_card_id"`
	// Arguments are the card's content.arguments as the ledger stores
	// them; absent when the views hold no such card.
	Arguments       json.RawMessage `json:"arguments,omitempty"`
	ArgumentsDigest string          `json:"arguments_digest"`
	// RequestedBy is ApprovalRequestedByDefinition or
	// ApprovalRequestedByWorker.
	RequestedBy string `json:"requested_by"`
	// Approvers are the only approvers who may decide (empty: any approver
	// of the project); AllowSelfApproval lets the agent's namesake decide.
	Approvers         []string `json:"approvers,omitempty"`
	AllowSelfApproval bool     `json:"allow_self_approval,omitempty"`
	// RequestedAt is the held entry's time; ExpiresAt when the ledger
	// decides expired if nobody decided.
	RequestedAt time.Time `json:"requested_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	// State is ApprovalPending, or the decision: ApprovalApproved,
	// ApprovalDenied, ApprovalExpired or ApprovalCanceled.
	State string `json:"state"`
	// Approver, Reason and DecidedAt are the decision's (absent while
	// pending).
	Approver  string     `json:"approver,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	DecidedAt *time.Time `json:"decided_at,omitempty"`
	// HeldSeq is the held entry's sequence; DecisionSeq the approval
	// entry's (0 while pending).
	HeldSeq     uint64 `json:"held_seq"`
	DecisionSeq uint64 `json:"decision_seq,omitempty"`
}

// ApprovalListResult is one page of approval.list.
type ApprovalListResult struct {
	// AsOfSeq is the ledger sequence the page reads the views at;
	// LedgerSeq the ledger stream's last sequence when the request arrived
	// (AsOfSeq below it: the views had not caught up in time).
	AsOfSeq   uint64         `json:"as_of_seq"`
	LedgerSeq uint64         `json:"ledger_seq,omitempty"`
	Items     []ApprovalItem `json:"items"`
	// NextCursor continues the listing; empty when there is no more.
	NextCursor string `json:"next_cursor,omitempty"`
}

// ApprovalGetResult is the answer of approval.get.
type ApprovalGetResult struct {
	AsOfSeq   uint64       `json:"as_of_seq"`
	LedgerSeq uint64       `json:"ledger_seq,omitempty"`
	Approval  ApprovalItem `json:"approval"`
}
