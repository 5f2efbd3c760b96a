package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// KindAttempt is the entry kind of an attempt: the intent to run a
// side_effectful tool, recorded before the tool runs (docs/side-effects.md).
const KindAttempt EntryKind = "attempt"

// OpAttemptStart records an attempt of a side_effectful tool before it runs,
// or answers which attempt is open (docs/protocol.md, attempt.start).
const OpAttemptStart = "attempt.start"

// HeaderIdempotencyKey carries a call's idempotency key (IdempotencyKey) on
// its command and on its attempt entries, so a tool can hand it to an
// upstream that deduplicates.
const HeaderIdempotencyKey = "CG-Idempotency-Key"

// HTTPIdempotencyKey is the header an HTTP tool sends the key in, as payment
// APIs name it.
const HTTPIdempotencyKey = "Idempotency-Key"

// CodeToolOutcomeUnknown is the taxonomy code (error.detail.taxonomy_code) of
// a side_effectful call whose attempt started and whose outcome was lost (its
// executor or tool service died between the effect and the report) and whose
// tool has no reconcile to find it out. The call ends failed and is never run
// again by itself.
const CodeToolOutcomeUnknown = "S-TOOL-OUTCOME-UNKNOWN"

// Attempt outcomes a report may carry (ReportPayload.AttemptOutcome): how an
// attempt left open by a crash was resolved.
const (
	// AttemptReconciled: the tool's reconcile found the attempt done; the
	// report's result is what it found.
	AttemptReconciled = "reconciled"
	// AttemptOutcomeUnknown: nothing could tell whether the attempt took
	// effect; the report is failed with CodeToolOutcomeUnknown.
	AttemptOutcomeUnknown = "outcome_unknown"
	// AttemptNotDone is the PreviousOutcome of an attempt started after the
	// reconcile of the one before found it not done.
	AttemptNotDone = "not_done"
)

// ValidAttemptOutcome reports whether s may be a report's attempt_outcome.
func ValidAttemptOutcome(s string) bool { return s == AttemptReconciled || s == AttemptOutcomeUnknown }

// IdempotencyKey is the call's idempotency key: the same for every delivery,
// attempt and executor of one call, and for every redrive of it (a call id
// <root>~r<n> has the key of <root>), different for every other call. It is
// "idem-" and the first 32 hex digits of SHA-256 over the project, turn and
// (root) call ids, each as <decimal length>:<bytes>; (so that no two splits
// of the same text collide). Services in other languages compute the same
// key, or read it from the command's CG-Idempotency-Key.
func IdempotencyKey(project, turnID, callID string) string {
	if root, _, ok := RedriveOrigin(callID); ok {
		callID = root
	}
	h := sha256.New()
	for _, p := range []string{project, turnID, callID} {
		h.Write([]byte(strconv.Itoa(len(p)) + ":" + p + ";"))
	}
	return "idem-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// AttemptSubject builds cg.<ver>.<project>.<channel>.ledger.attempt.<agent_turn_id>.<tool_call_id>.
func AttemptSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectAttempt, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// AttemptEntry is the data of an attempt entry: one per (call, attempt
// number), written before the tool runs.
type AttemptEntry struct {
	ProjectID   string `json:"project_id"`
	ChannelID   string `json:"channel_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	ToolName    string `json:"tool_name,omitempty"`
	// Attempt numbers the call's attempts from 1.
	Attempt uint64 `json:"attempt"`
	// ExecutorID names who runs the attempt: the executor's source id or the
	// tool service's (the request's CG-Actor is recorded besides).
	ExecutorID     string `json:"executor_id"`
	IdempotencyKey string `json:"idempotency_key"`
	// DeadlineUnixMS is when the attempt must have its outcome, if the
	// runner knows it (0: not given).
	DeadlineUnixMS int64 `json:"deadline_unix_ms,omitempty"`
	// PreviousOutcome closes the attempt before this one: AttemptNotDone
	// when its reconcile found it had no effect. Empty on attempt 1.
	PreviousOutcome string `json:"previous_outcome,omitempty"`
}

// AttemptStartRequest is the body of attempt.start.
type AttemptStartRequest struct {
	ProjectID   string `json:"project_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	// ExecutorID names the executor or tool service instance (a name:
	// letters, digits, . _ - :).
	ExecutorID     string `json:"executor_id"`
	DeadlineUnixMS int64  `json:"deadline_unix_ms,omitempty"`
	// NotDone, when not 0, is the number of the open attempt whose
	// reconcile found it not done: the attempt after it is started (if
	// NotDone is still the latest attempt).
	NotDone uint64 `json:"not_done,omitempty"`
}

// AttemptStartResult is the answer of attempt.start.
type AttemptStartResult struct {
	// Started says this request recorded attempt Attempt: run the tool
	// now. When false, attempt Attempt was recorded before and has no
	// outcome: reconcile it, never run the tool on this answer.
	Started bool   `json:"started"`
	Attempt uint64 `json:"attempt"`
	// Seq is the attempt entry's sequence.
	Seq            uint64 `json:"seq"`
	IdempotencyKey string `json:"idempotency_key"`
	// ExecutorID is who started attempt Attempt.
	ExecutorID     string `json:"executor_id"`
	DeadlineUnixMS int64  `json:"deadline_unix_ms,omitempty"`
}

// ParseAttemptStart reads an attempt.start body, listing every violation.
func ParseAttemptStart(body []byte) (AttemptStartRequest, Violations) {
	var vs Violations
	var r AttemptStartRequest
	o, ok := ParseObject("body", body, &vs)
	if !ok {
		return r, vs
	}
	r.ProjectID, r.AgentTurnID, r.ToolCallID = o.Ident("project_id", true), o.Ident("agent_turn_id", true), o.Ident("tool_call_id", true)
	r.ExecutorID = o.Str("executor_id", true)
	if r.ExecutorID != "" {
		CheckName(&vs, o.Path("executor_id"), r.ExecutorID, true)
	}
	r.DeadlineUnixMS = nonNegative(o, "deadline_unix_ms", &vs)
	r.NotDone = uint64(nonNegative(o, "not_done", &vs))
	return r, vs
}

// nonNegative reads an optional integer member that must not be negative.
func nonNegative(o JSONObject, key string, vs *Violations) int64 {
	raw := o.Raw(key)
	if raw == nil || string(raw) == "null" {
		return 0
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 0 {
		vs.Add(o.Path(key), VInvalidType, "must be a non-negative integer, got %s", Clip(string(raw)))
		return 0
	}
	return n
}
