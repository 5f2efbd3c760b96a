package protocol

import (
	"encoding/json"
	"time"
)

// Call record states, in the order a call moves through them.
const (
	StateDispatched = "dispatched" // command published (or about to be)
	StateClaimed    = "claimed"    // a report is stored; the agent is being woken (or, in records of earlier versions, the entry is being appended)
	StateWoken      = "woken"      // report appended and wakeup published (or recorded as skipped)
)

// CallID is the identity of one call as the ledger stores it: where it was
// dispatched (project, channel), by whom (agent, turn and its epoch), and
// its id in the turn. It is embedded where a stored value repeats it (the
// call record, the report and duplicate entries); its fields encode in
// place, so those values' JSON is what it was with the fields spelled out.
type CallID struct {
	ProjectID   string `json:"project_id"`
	ChannelID   string `json:"channel_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	TurnEpoch   uint64 `json:"turn_epoch"`
	ToolCallID  string `json:"tool_call_id"`
}

// CallRecord is the KV record of one call, keyed by (project_id,
// agent_turn_id, tool_call_id). Dispatch creates it; the report path moves it
// forward with compare-and-set updates, which is what makes the report
// exactly-once (docs/report-path.md).
type CallRecord struct {
	State string `json:"state"`
	CallID
	StepID         string       `json:"step_id,omitempty"`
	Subject        string       `json:"subject"`
	ToolName       string       `json:"tool_name,omitempty"`
	AfterExecution string       `json:"after_execution"`
	ToolCallCardID string       `json:"tool_call_card_id"`
	CardSeq        uint64       `json:"card_seq"`
	CardMetadata   CardMetadata `json:"card_metadata"`
	// DispatchFingerprint identifies the dispatch request, so a retry of the
	// same dispatch is told apart from a different one reusing the ids.
	DispatchFingerprint string `json:"dispatch_fingerprint"`
	CommandSeq          uint64 `json:"command_seq,omitempty"`
	Claim               *Claim `json:"claim,omitempty"`
	// DispatchedAt is when dispatch created the record (the call latency
	// metric's start); zero in records of earlier versions.
	DispatchedAt time.Time `json:"dispatched_at,omitzero"`
	// ToolDefSeq is the ledger sequence of the tool definition in force at
	// dispatch, and ToolVersion its version: every delivery and retry of
	// the call runs that definition (ExecutionInputs reads it), even after
	// a new one is registered; anything else that acts for the call must
	// too. Zero (and empty) for a tool that was not registered at
	// dispatch (a built-in, a PMO command) and in records of earlier
	// versions.
	ToolDefSeq  uint64 `json:"tool_def_seq,omitempty"`
	ToolVersion string `json:"tool_version,omitempty"`
	// Outcome is how a side_effectful call's attempt left open by a crash
	// was resolved, from its report's attempt_outcome: "reconciled" or
	// "outcome_unknown" (protocol.Attempt*). call.get fills it from the
	// stored report; it is never stored in the record itself.
	Outcome string `json:"outcome,omitempty"`
	// DeadlineUnixMS is the call's deadline fixed at dispatch (Unix
	// milliseconds), the one its command carries: a call with no accepted
	// report by then ends timeout, recorded by the ledger. Zero in records
	// of earlier versions.
	DeadlineUnixMS int64 `json:"deadline_unix_ms,omitempty"`
	// Held is set at dispatch for a call held for approval (state
	// StateAwaitingApproval, no deadline, no command) and kept after its
	// decision: what the decision's follow-up needs. Nil for a call that
	// was never held.
	Held *HeldCall `json:"held,omitempty"`
	// Paused is set when the call was held because its tool was paused
	// (state StatePaused, a deadline, no command): the command resume
	// publishes. Kept after the release. Nil for a call never held so.
	Paused *PausedCall `json:"paused,omitempty"`
}

// PausedCall is the command of a call held by a paused tool, as dispatch
// would have published it (its CG-* headers and payload, the deadline
// already in the record), and where its hold is recorded.
type PausedCall struct {
	Header  map[string][]string `json:"header"`
	Payload json.RawMessage     `json:"payload"`
	// PauseSeq is the sequence of the pause entry that held the call.
	PauseSeq uint64 `json:"pause_seq"`
	// HeldSeq is the held entry's sequence, once recorded.
	HeldSeq uint64 `json:"held_seq,omitempty"`
}

// HeldCall is a held call's command as dispatch would have published it
// (its CG-* headers and payload, without a deadline: approval fixes it at
// the decision's time plus BudgetMS) and the approval's terms as pinned at
// dispatch.
type HeldCall struct {
	ExpiresUnixMS     int64               `json:"expires_unix_ms"`
	BudgetMS          int64               `json:"budget_ms"`
	RequestedBy       string              `json:"requested_by"`
	Approvers         []string            `json:"approvers,omitempty"`
	AllowSelfApproval bool                `json:"allow_self_approval,omitempty"`
	ArgumentsDigest   string              `json:"arguments_digest"`
	Header            map[string][]string `json:"header"`
	Payload           json.RawMessage     `json:"payload"`
	// HeldSeq is the held entry's sequence, once dispatch recorded it.
	HeldSeq uint64 `json:"held_seq,omitempty"`
}

// Deadline is the call's deadline as a time; zero when the record has none.
func (r *CallRecord) Deadline() time.Time {
	if r.DeadlineUnixMS <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(r.DeadlineUnixMS)
}

// Claim is the winning report of a call, with everything needed to append its
// entry and wake the agent, so any retry can finish the work identically.
type Claim struct {
	Fingerprint             string              `json:"fingerprint"`
	Status                  string              `json:"status"`
	AfterExecution          string              `json:"after_execution"`
	EffectiveAfterExecution string              `json:"effective_after_execution"`
	ToolResultCardID        string              `json:"tool_result_card_id"`
	SourceID                string              `json:"source_id"`
	Subject                 string              `json:"subject"`
	MsgID                   string              `json:"msg_id"`
	Header                  map[string][]string `json:"header"`
	Data                    json.RawMessage     `json:"data"`
	Seq                     uint64              `json:"seq,omitempty"`
	WakeupSubject           string              `json:"wakeup_subject,omitempty"`
	WakeupSeq               uint64              `json:"wakeup_seq,omitempty"`
	WorkerTarget            string              `json:"worker_target,omitempty"`
	WakeupSkipped           bool                `json:"wakeup_skipped,omitempty"`
	// LeaseUntil is how long the claim's writer alone may append the entry
	// and publish the wakeup: a concurrent identical report waits for it to
	// finish and answers duplicate, and takes over only after the lease
	// (its writer crashed or stalled). One wakeup per report reaches core
	// NATS subscribers, except after such a takeover.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// AttemptOutcome is the report's attempt_outcome (ReportEntry), kept
	// after the entry's bytes are dropped from the record.
	AttemptOutcome string `json:"attempt_outcome,omitempty"`
	// ErrorCode is the result card's error.code ("" when the card has no
	// error), read where the ledger checks the card against the report, for
	// its metrics (cgledger_tool_calls_total). Never persisted: the card
	// holds it, so a claim read back from a call record or a stored entry
	// has none, and the ledger reads the card again before it appends such
	// a claim.
	ErrorCode string `json:"-"`
}
