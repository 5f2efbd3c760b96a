package projector

import (
	"encoding/json"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// Call lifecycle states in the call-state view.
const (
	StateDispatched = "dispatched"
	StateReported   = "reported"
	StateConsumed   = "consumed"
	StateRejected   = "rejected"
	// StateAwaitingApproval is a held call's state from its held entry
	// until its command (approved) or its report (denied, expired,
	// canceled): docs/approvals.md.
	StateAwaitingApproval = protocol.StateAwaitingApproval
	// StatePaused is the state of a call held because its tool is paused,
	// from its held entry (reason paused) until its command (the resume)
	// or its report (its deadline passed while paused).
	StatePaused = protocol.StatePaused
)

// Inbox entry states.
const (
	InboxPending  = protocol.InboxPending
	InboxConsumed = protocol.InboxConsumed
)

// CallState is the state of one call (project, agent_turn_id, tool_call_id)
// as of a ledger sequence: dispatched -> reported -> consumed, or rejected,
// with the sequence and time of each step.
type CallState struct {
	ProjectID      string `json:"project_id"`
	ChannelID      string `json:"channel_id,omitempty"`
	AgentID        string `json:"agent_id,omitempty"`
	AgentTurnID    string `json:"agent_turn_id"`
	ToolCallID     string `json:"tool_call_id"`
	TurnEpoch      uint64 `json:"turn_epoch"`
	StepID         string `json:"step_id,omitempty"`
	ToolName       string `json:"tool_name,omitempty"`
	Subject        string `json:"subject,omitempty"`
	ToolCallCardID string `json:"tool_call_card_id,omitempty"`
	State          string `json:"state"`

	DispatchedSeq uint64     `json:"dispatched_seq,omitempty"`
	DispatchedAt  *time.Time `json:"dispatched_at,omitempty"`

	ReportedSeq             uint64     `json:"reported_seq,omitempty"`
	ReportedAt              *time.Time `json:"reported_at,omitempty"`
	Status                  string     `json:"status,omitempty"`
	ToolResultCardID        string     `json:"tool_result_card_id,omitempty"`
	AfterExecution          string     `json:"after_execution,omitempty"`
	EffectiveAfterExecution string     `json:"effective_after_execution,omitempty"`
	SourceID                string     `json:"source_id,omitempty"`

	WakeupSeq     uint64 `json:"wakeup_seq,omitempty"`
	WorkerTarget  string `json:"worker_target,omitempty"`
	WakeupSkipped bool   `json:"wakeup_skipped,omitempty"`

	ConsumedSeq uint64     `json:"consumed_seq,omitempty"`
	ConsumedAt  *time.Time `json:"consumed_at,omitempty"`

	CancelRequestedSeq uint64 `json:"cancel_requested_seq,omitempty"`

	RejectedSeq   uint64 `json:"rejected_seq,omitempty"`
	LastRejection string `json:"last_rejection,omitempty"`
	Rejections    int    `json:"rejections"`
	Duplicates    int    `json:"duplicates"`

	// Attempt is the number of the call's latest attempt on record (a
	// side_effectful tool's attempt.start), AttemptSeq its entry.
	Attempt    uint64 `json:"attempt,omitempty"`
	AttemptSeq uint64 `json:"attempt_seq,omitempty"`
	// Outcome is how an attempt left open by a crash was resolved, from
	// the report's attempt_outcome: "reconciled" or "outcome_unknown".
	Outcome string `json:"outcome,omitempty"`

	// HeldSeq and HeldAt are a held call's held entry (docs/approvals.md):
	// such a call is listed (ix rows) at its held time, before it has a
	// dispatch. Approval and ApprovalSeq are its decision and the approval
	// entry that recorded it.
	HeldSeq     uint64     `json:"held_seq,omitempty"`
	HeldAt      *time.Time `json:"held_at,omitempty"`
	Approval    string     `json:"approval,omitempty"`
	ApprovalSeq uint64     `json:"approval_seq,omitempty"`
	// PausedSeq is the held entry (reason paused) of a call held because
	// its tool was paused.
	PausedSeq uint64 `json:"paused_seq,omitempty"`

	// Resolution is an operator's resolution of an outcome_unknown call
	// (call.resolve: applied or not_applied), ResolutionSeq its entry.
	Resolution    string `json:"resolution,omitempty"`
	ResolutionSeq uint64 `json:"resolution_seq,omitempty"`
	// RedriveCallID is the call an operator's redrive derived from this
	// one (call.redrive: <root>~r<n>), RedriveSeq the redrive entry.
	RedriveCallID string `json:"redrive_call_id,omitempty"`
	RedriveSeq    uint64 `json:"redrive_seq,omitempty"`

	// UpdatedSeq is the sequence of the entry that produced this version.
	UpdatedSeq uint64 `json:"updated_seq"`
}

// InboxEntry is a reported result in an agent's Inbox (protocol.InboxEntry:
// inbox.list answers the same entries over NATS).
type InboxEntry = protocol.InboxEntry

// TimelineItem is one ledger entry in a turn timeline or call story.
type TimelineItem struct {
	Seq     uint64              `json:"seq"`
	Time    time.Time           `json:"time"`
	Kind    string              `json:"kind"`
	Subject string              `json:"subject"`
	Headers map[string][]string `json:"headers,omitempty"`
	// Data is the entry's data: JSON when it is JSON, else a JSON string.
	Data json.RawMessage `json:"data"`
	// Reason says why an unrecognized entry is not a ledger entry, or why
	// the operator skipped a skipped one; SkipSeq is that skip entry.
	Reason  string `json:"reason,omitempty"`
	SkipSeq uint64 `json:"skip_seq,omitempty"`
}

// CardVersion is a card as stored by the entry at Seq.
type CardVersion struct {
	Seq  uint64          `json:"seq"`
	Time time.Time       `json:"time"`
	Card json.RawMessage `json:"card"`
}

// storedEntry is the e\0<seq> row: the entry as the projector saw it.
type storedEntry struct {
	Subject string              `json:"subject"`
	Kind    string              `json:"kind"`
	Headers map[string][]string `json:"headers,omitempty"`
	Data    []byte              `json:"data"`
	Time    time.Time           `json:"time"`
}
