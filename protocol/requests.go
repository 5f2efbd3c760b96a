package protocol

import "encoding/json"

// DispatchRequest asks the ledger to write a tool.call card and publish the
// tool command that points at it.
type DispatchRequest struct {
	// Subject is the command subject: cg.<ver>.<project>.<channel>.cmd.tool.<target>...
	// or cg.<ver>.<project>.<channel>.cmd.sys.pmo.internal.<tool>.
	Subject  string
	Identity Identity
	// Card is the tool.call card; its card_id must equal Payload.ToolCallCardID.
	Card    Card
	Payload ToolCommandPayload
	// Approval, when set with Required, holds this call for approval
	// whether or not the tool's definition requires it.
	Approval *DispatchApproval
	// Checks, when set, asks the ledger to refuse (and record the refusal
	// of) a dispatch whose tool is unknown or whose arguments fail the
	// tool's schema, before it writes anything.
	Checks *DispatchChecks
}

// DispatchResult is the outcome of a dispatch.
type DispatchResult struct {
	Subject        string `json:"subject"`
	ToolCallCardID string `json:"tool_call_card_id"`
	CardSeq        uint64 `json:"card_seq"`
	CommandSeq     uint64 `json:"command_seq"`
	// Duplicate is true when this exact dispatch had already been made; the
	// sequences are the original ones.
	Duplicate bool `json:"duplicate"`
	// ToolDefSeq and ToolVersion are the tool definition the call pinned
	// (CallRecord.ToolDefSeq); zero and empty when the tool is not
	// registered.
	ToolDefSeq  uint64 `json:"tool_def_seq,omitempty"`
	ToolVersion string `json:"tool_version,omitempty"`
	// ToolUnavailable is true when the ledger answered the call at once,
	// failed with S-TOOL-UNAVAILABLE (health.fail_fast_after_ms).
	ToolUnavailable bool `json:"tool_unavailable,omitempty"`
	// DeadlineUnixMS is the call's deadline, fixed at dispatch (the
	// command carries it); zero for a call dispatched by an earlier version.
	DeadlineUnixMS int64 `json:"deadline_unix_ms,omitempty"`
	// AwaitingApproval is true when the call is held for approval: its
	// command is published (and its deadline fixed) only once approved.
	AwaitingApproval bool `json:"awaiting_approval,omitempty"`
	// ApprovalExpiresUnixMS is when a held call expires undecided.
	ApprovalExpiresUnixMS int64 `json:"approval_expires_unix_ms,omitempty"`
	// Paused is true when the call's tool is paused: the call is held (no
	// command) until a resume publishes its command, its deadline
	// (DeadlineUnixMS, fixed now) running meanwhile.
	Paused bool `json:"paused,omitempty"`
}

// ReportPayload is the business payload of a tool result report: routing and
// pointer fields only; the result itself lives in the tool.result card.
type ReportPayload struct {
	Status           string `json:"status"`
	AfterExecution   string `json:"after_execution"`
	ToolResultCardID string `json:"tool_result_card_id"`
	StepID           string `json:"step_id,omitempty"`
	// AttemptOutcome says how an attempt of a side_effectful tool left open
	// by a crash was resolved (AttemptReconciled, AttemptOutcomeUnknown);
	// empty for the report of an attempt that ran to its end.
	AttemptOutcome string `json:"attempt_outcome,omitempty"`
}

// ReportRequest is a tool result report: the call's identity unchanged from
// the command, the reporting source, and the payload.
type ReportRequest struct {
	ProjectID string
	ChannelID string
	Identity  Identity
	// SourceID and SourceFunction name the reporting tool service; they must
	// equal the result card's author_id and function_name.
	SourceID       string
	SourceFunction string
	Payload        ReportPayload
}

// WakeupOutcome says where the agent was woken, or why it was not.
type WakeupOutcome struct {
	Subject      string `json:"subject,omitempty"`
	WorkerTarget string `json:"worker_target,omitempty"`
	Seq          uint64 `json:"seq,omitempty"`
	Skipped      bool   `json:"skipped"`
	Reason       string `json:"reason,omitempty"`
}

// ReportOutcome is the accepted report of a call. For a duplicate it is the
// original outcome, with Duplicate set.
type ReportOutcome struct {
	Seq                     uint64        `json:"seq"`
	AgentTurnID             string        `json:"agent_turn_id"`
	ToolCallID              string        `json:"tool_call_id"`
	ToolResultCardID        string        `json:"tool_result_card_id"`
	Status                  string        `json:"status"`
	AfterExecution          string        `json:"after_execution"`
	EffectiveAfterExecution string        `json:"effective_after_execution"`
	Duplicate               bool          `json:"duplicate"`
	DuplicateSeq            uint64        `json:"duplicate_seq,omitempty"`
	Wakeup                  WakeupOutcome `json:"wakeup"`
}

// NoRosterEntry is the reason a wakeup is skipped when the agent has no
// roster entry.
const NoRosterEntry = "no_roster_entry"

// CancelRequest asks to cancel a call in flight.
type CancelRequest struct {
	ProjectID   string `json:"project_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	Reason      string `json:"reason,omitempty"`
}

// CancelResult is the outcome of a cancel request.
type CancelResult struct {
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
}

// ConsumeRequest says an agent has consumed the reported result of one of its
// calls from its Inbox.
type ConsumeRequest struct {
	ProjectID   string `json:"project_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
}

// ConsumeResult is the outcome of a consume.
type ConsumeResult struct {
	Seq       uint64 `json:"seq"`
	ReportSeq uint64 `json:"report_seq"`
	// Duplicate is true when the result had already been consumed; Seq is
	// then the original consumed entry's.
	Duplicate bool `json:"duplicate"`
}

// RosterResult is an agent's roster entry and the sequence that wrote it.
type RosterResult struct {
	RosterEntry
	Seq uint64 `json:"seq"`
}

// PutCardResult is the outcome of a card put.
type PutCardResult struct {
	CardID string `json:"card_id"`
	// Seq is the ledger sequence of the entry holding the card.
	Seq uint64 `json:"seq"`
	// Duplicate is true when an identical card was already stored; Seq is then
	// the original entry's.
	Duplicate bool `json:"duplicate"`
}

// ToolConsumer names the durable consumer a tool service pulls its commands
// from (see docs/protocol.md, "tool.consumer").
type ToolConsumer struct {
	Stream         string   `json:"stream"`
	Consumer       string   `json:"consumer"`
	FilterSubjects []string `json:"filter_subjects"`
	// APIPrefix is the JetStream API prefix to pull it with (credentials
	// on): the tool service's JetStream client must use it.
	APIPrefix string `json:"api_prefix"`
	// MaxAckPending is how many delivered commands may wait for an ack at
	// once: past it the consumer delivers nothing more, so a service
	// keeps its pulls and work in flight below it.
	MaxAckPending int `json:"max_ack_pending"`
	// MaxWaiting is how many pull requests may wait on the consumer at
	// once (all of a tool's service instances together); more are refused.
	MaxWaiting int `json:"max_waiting"`
	// AckWaitMS is how long, in milliseconds, a delivered command waits
	// for an ack (or a progress ack) before it is delivered again.
	AckWaitMS int64 `json:"ack_wait_ms"`
}

// SkipRequest is the body of projector.skip.
type SkipRequest struct {
	Seq    uint64 `json:"seq"`
	Reason string `json:"reason"`
}

// MaxSkipReason bounds a skip entry's reason, in bytes.
const MaxSkipReason = 1024

// SkipResult is the outcome of Ledger.Skip.
type SkipResult struct {
	// Seq is the skipped sequence.
	Seq uint64 `json:"seq"`
	// SkipSeq is the sequence of the skip entry (the existing one when
	// Duplicate).
	SkipSeq uint64 `json:"skip_seq"`
	Reason  string `json:"reason"`
	// Subject is the skipped entry's subject, as recorded in the skip entry.
	Subject string `json:"subject,omitempty"`
	// Duplicate says an identical skip (same seq and reason) already existed
	// and nothing was appended.
	Duplicate bool `json:"duplicate,omitempty"`
}

// CallRef names one call: the body of call.get, cancel.get (which needs
// ChannelID too, as the cancel subject holds it) and report.resume.
type CallRef struct {
	ProjectID   string `json:"project_id"`
	ChannelID   string `json:"channel_id,omitempty"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
}

// CancelState is the result of cancel.get: whether a cancellation of the
// call is recorded.
type CancelState struct {
	Canceled bool `json:"canceled"`
}

// CommandRejection is the body of command.reject: a tool command as an
// executor received it, and why the executor refused it. Data is the
// command's body as received (base64 in JSON, since a refused body need not
// be JSON or UTF-8).
type CommandRejection struct {
	Subject string              `json:"subject"`
	Headers map[string][]string `json:"headers,omitempty"`
	Data    []byte              `json:"data,omitempty"`
	Error   *Error              `json:"error"`
}

// RejectionResult is the result of command.reject: the rejection entry's
// sequence, and whether that command's rejection was already on record
// (a redelivered command refused again: Seq is then the first entry's).
type RejectionResult struct {
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

// DispatchBody is the JSON body of a dispatch API request (the identity goes in
// CG-* headers).
type DispatchBody struct {
	Subject  string            `json:"subject"`
	Card     json.RawMessage   `json:"card"`
	Payload  json.RawMessage   `json:"payload"`
	Approval *DispatchApproval `json:"approval,omitempty"`
	Checks   *DispatchChecks   `json:"checks,omitempty"`
}
