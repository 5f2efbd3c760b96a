package protocol

import (
	"encoding/json"
	"time"
)

// EntryKind is the value of the CG-Entry-Kind header on ledger entries.
type EntryKind string

// Entry kinds the ledger writes.
const (
	KindCard          EntryKind = "card"
	KindCommand       EntryKind = "command"
	KindReport        EntryKind = "report"
	KindDuplicate     EntryKind = "duplicate"
	KindWakeup        EntryKind = "wakeup"
	KindWakeupSkipped EntryKind = "wakeup_skipped"
	KindRejection     EntryKind = "rejection"
	KindRoster        EntryKind = "roster"
	KindConsumed      EntryKind = "consumed"
	KindTool          EntryKind = "tool"
	KindCancel        EntryKind = "cancel"
	KindSkip          EntryKind = "skip"
)

// knownKinds are the CG-Entry-Kind values this build can interpret; any
// other value is an unrecognized entry (RecognizeEntry).
var knownKinds = map[EntryKind]bool{
	KindCard: true, KindCommand: true, KindReport: true, KindDuplicate: true, KindWakeup: true,
	KindWakeupSkipped: true, KindRejection: true, KindRoster: true, KindConsumed: true, KindTool: true,
	KindCancel: true, KindSkip: true, KindAttempt: true, KindPrepared: true, KindDecision: true, KindHeld: true, KindApproval: true,
	KindResolution: true,
	KindToolPause:  true,
	KindRedrive:    true,
}

// SkipEntry is the data of a skip entry: an operator's audited decision that
// the projector records entry Seq as skipped instead of stopping on it,
// because it cannot be applied (docs/views.md, "Operator recovery").
type SkipEntry struct {
	// Seq is the skipped entry's sequence; it precedes the skip entry.
	Seq uint64 `json:"seq"`
	// Reason is the operator's explanation, required.
	Reason string `json:"reason"`
	// Subject is the skipped entry's subject when the skip was written
	// (empty if the stream no longer held it), so the audit trail names what
	// was skipped without the entry itself.
	Subject string `json:"subject,omitempty"`
}

// CancelEntry records a worker's request to cancel a call in flight.
type CancelEntry struct {
	ProjectID   string `json:"project_id"`
	ChannelID   string `json:"channel_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	Reason      string `json:"reason,omitempty"`
}

// ConsumedEntry records that an agent consumed a reported result from its
// Inbox.
type ConsumedEntry struct {
	ProjectID   string `json:"project_id"`
	ChannelID   string `json:"channel_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	ReportSeq   uint64 `json:"report_seq"`
}

// ReportEntry is the data of a report entry: the callback's routing and
// pointer fields as sent, plus what the ledger resolved while validating it.
type ReportEntry struct {
	CallID
	StepID                  string `json:"step_id,omitempty"`
	Status                  string `json:"status"`
	AfterExecution          string `json:"after_execution"`
	EffectiveAfterExecution string `json:"effective_after_execution"`
	ToolResultCardID        string `json:"tool_result_card_id"`
	// ToolResultCardSeq is the result card's sequence when the ledger knew
	// it as it wrote the entry; absent from a report stored together with
	// its card (report.result): readers find the card by its id.
	ToolResultCardSeq uint64 `json:"tool_result_card_seq,omitempty"`
	ToolCallCardID    string `json:"tool_call_card_id"`
	ToolName          string `json:"tool_name,omitempty"`
	SourceID          string `json:"source_id"`
	SourceFunction    string `json:"source_function"`
	CommandSeq        uint64 `json:"command_seq,omitempty"`
	// AttemptOutcome is the report's attempt_outcome: how an attempt of a
	// side_effectful tool left open by a crash was resolved (empty for a
	// report of an attempt that ran to its end).
	AttemptOutcome string `json:"attempt_outcome,omitempty"`
}

// WakeupEntry is the data of a wakeup published to a worker.
type WakeupEntry struct {
	ProjectID               string `json:"project_id"`
	ChannelID               string `json:"channel_id"`
	AgentID                 string `json:"agent_id"`
	WorkerTarget            string `json:"worker_target"`
	AgentTurnID             string `json:"agent_turn_id"`
	TurnEpoch               uint64 `json:"turn_epoch"`
	ToolCallID              string `json:"tool_call_id"`
	Status                  string `json:"status"`
	ToolResultCardID        string `json:"tool_result_card_id"`
	EffectiveAfterExecution string `json:"effective_after_execution"`
	ReportSeq               uint64 `json:"report_seq"`
	// Phase is PhasePrepared on the wakeup of a prepared call (status
	// PhasePrepared, ReportSeq the prepared entry's sequence): it asks the
	// worker for a commit or abort, and is not the call's result. Empty
	// on a result's wakeup.
	Phase string `json:"phase,omitempty"`
}

// WakeupSkippedEntry records that an accepted report's agent had no roster
// entry, so no wakeup could be routed.
type WakeupSkippedEntry struct {
	ProjectID   string `json:"project_id"`
	ChannelID   string `json:"channel_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	ReportSeq   uint64 `json:"report_seq"`
	Reason      string `json:"reason"`
}

// DuplicateEntry records a report that repeated an already-accepted one.
type DuplicateEntry struct {
	CallID
	Status           string `json:"status"`
	ToolResultCardID string `json:"tool_result_card_id"`
	SourceID         string `json:"source_id"`
	OriginalSeq      uint64 `json:"original_seq"`
}

// RosterEntry is the data of a roster entry: the agent's current worker target.
type RosterEntry struct {
	ProjectID    string `json:"project_id"`
	AgentID      string `json:"agent_id"`
	WorkerTarget string `json:"worker_target"`
}

// RejectionEntry records a refused request so the history explains every "no".
type RejectionEntry struct {
	// Op is the refused operation: card.put, dispatch, report, roster.set.
	Op         string      `json:"op"`
	Code       Code        `json:"code"`
	Message    string      `json:"message"`
	Violations []Violation `json:"violations,omitempty"`
	// Request is what was received: subject (if any), headers and data.
	Request RejectedRequest `json:"request"`
}

// RejectedRequest is the refused request as received. The entry must always
// be valid JSON and valid UTF-8, whatever the client sent:
//   - Data holds the body as JSON when it was valid JSON, else as a JSON
//     string; DataBase64 holds it instead (standard base64) when it is not
//     valid UTF-8.
//   - Headers holds the headers whose name and values are valid UTF-8;
//     HeadersBase64 holds the others, name and values base64-encoded.
//
// The body is cut at MaxRejectedData bytes and the headers at
// MaxRejectedHeaders bytes; Truncated says when either was cut.
type RejectedRequest struct {
	Subject       string              `json:"subject,omitempty"`
	Headers       map[string][]string `json:"headers,omitempty"`
	HeadersBase64 map[string][]string `json:"headers_base64,omitempty"`
	Data          json.RawMessage     `json:"data,omitempty"`
	DataBase64    string              `json:"data_base64,omitempty"`
	Truncated     bool                `json:"truncated,omitempty"`
}

// MaxRejectedData bounds the request body kept in a rejection entry, so a
// refused oversized request can still be recorded.
const MaxRejectedData = 16 << 10

// MaxRejectedHeaders bounds the request headers kept in a rejection entry
// (counted as in MaxHeaderBytes), for the same reason.
const MaxRejectedHeaders = MaxHeaderBytes

// Entry is one ledger entry read back from the stream.
type Entry struct {
	Seq     uint64              `json:"seq"`
	Subject string              `json:"subject"`
	Headers map[string][]string `json:"headers,omitempty"`
	Data    []byte              `json:"data"`
	Time    time.Time           `json:"time"`
}
