package protocol

import "strings"

// Two-phase commit (seed 004, 6.3): a tool answers a call "prepared" with a
// commit token and a commit deadline instead of a final result; the call's
// worker then commits or aborts it, or the ledger aborts it at the commit
// deadline; the decision is routed to the tool, which reports the call's
// final result through the ordinary report path (docs/side-effects.md).

// KindPrepared is the entry kind of a call's prepare: one per call, on
// PreparedSubject.
const KindPrepared EntryKind = "prepared"

// KindDecision is the entry kind of a prepared call's decision (commit or
// abort): one per call, on DecisionSubject, which is under the tool's own
// command subject so that the tool's consumer delivers it.
const KindDecision EntryKind = "decision"

// Two-phase operations: prepare by the call's tool, commit and abort by the
// call's worker.
const (
	OpPrepare = "prepare"
	OpCommit  = "commit"
	OpAbort   = "abort"
)

// Decisions a decision entry records.
const (
	DecisionCommit = "commit"
	DecisionAbort  = "abort"
)

// Who decided: the worker (its commit or abort op) or the ledger, at the
// commit deadline (always an abort).
const (
	DecidedByWorker         = "worker"
	DecidedByCommitDeadline = "commit_deadline"
)

// Two-phase states, as call.get's two_phase.state shows them.
const (
	PhasePrepared  = "prepared"
	PhaseCommitted = "committed"
	PhaseAborted   = "aborted"
)

// DecisionToken is the target token, after the tool's name, that marks a
// decision's subject: cg.<ver>.<p>.<c>.cmd.tool.<tool>.decision.<turn>.<call>.
// A command may not be dispatched on such a subject.
const DecisionToken = "decision"

// MaxCommitTokenLen bounds a commit token.
const MaxCommitTokenLen = 256

// PreparedSubject builds cg.<ver>.<project>.<channel>.ledger.prepared.<agent_turn_id>.<tool_call_id>.
func PreparedSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectPrepared, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// DecisionSubject builds cg.<ver>.<project>.<channel>.cmd.tool.<tool>.decision.<agent_turn_id>.<tool_call_id>:
// the tool's consumer (cmd.tool.<tool>.>) delivers it, and it is the call's
// own, so at most one decision is stored per call.
func DecisionSubject(version, project, channel, tool, turnID, callID string) string {
	return ToolCommandSubject(version, project, channel, tool, DecisionToken, turnID, callID)
}

// IsDecisionSubject reports whether a tool command subject's target is a
// decision's (<tool>.decision.<turn>.<call>).
func IsDecisionSubject(s Subject) bool {
	return s.Kind == SubjectToolCommand && len(s.Target) == 4 && s.Target[1] == DecisionToken
}

// PrepareRequest is the body of prepare.
type PrepareRequest struct {
	ProjectID   string `json:"project_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	// CommitToken is the tool's: the worker presents it to commit or
	// abort, and the decision routed back carries it.
	CommitToken string `json:"commit_token"`
	// CommitDeadlineUnixMS is when the ledger aborts the call if no
	// decision was taken; at most the call's deadline.
	CommitDeadlineUnixMS int64 `json:"commit_deadline_unix_ms"`
}

// PreparedEntry is the data of a prepared entry.
type PreparedEntry struct {
	ProjectID            string `json:"project_id"`
	ChannelID            string `json:"channel_id"`
	AgentID              string `json:"agent_id"`
	AgentTurnID          string `json:"agent_turn_id"`
	TurnEpoch            uint64 `json:"turn_epoch"`
	ToolCallID           string `json:"tool_call_id"`
	ToolName             string `json:"tool_name"`
	CommitToken          string `json:"commit_token"`
	CommitDeadlineUnixMS int64  `json:"commit_deadline_unix_ms"`
	// ToolTarget is the first target token of the call's command subject:
	// where the decision is routed.
	ToolTarget string `json:"tool_target"`
}

// PrepareResult is the answer of prepare.
type PrepareResult struct {
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate,omitempty"`
	// WakeupSeq is the prepared wakeup's sequence (0: the agent has no
	// roster entry, nobody was woken).
	WakeupSeq uint64 `json:"wakeup_seq,omitempty"`
}

// DecisionRequest is the body of commit and abort.
type DecisionRequest struct {
	ProjectID   string `json:"project_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	ToolCallID  string `json:"tool_call_id"`
	CommitToken string `json:"commit_token"`
}

// DecisionEntry is the data of a decision entry, which is also the message
// the tool receives: commit means run phase 2, abort means roll back.
type DecisionEntry struct {
	ProjectID   string `json:"project_id"`
	ChannelID   string `json:"channel_id"`
	AgentID     string `json:"agent_id"`
	AgentTurnID string `json:"agent_turn_id"`
	TurnEpoch   uint64 `json:"turn_epoch"`
	ToolCallID  string `json:"tool_call_id"`
	ToolName    string `json:"tool_name"`
	// Decision is DecisionCommit or DecisionAbort.
	Decision string `json:"decision"`
	// DecidedBy is DecidedByWorker or DecidedByCommitDeadline.
	DecidedBy   string `json:"decided_by"`
	CommitToken string `json:"commit_token"`
	PreparedSeq uint64 `json:"prepared_seq"`
}

// DecisionResult is the answer of commit and abort.
type DecisionResult struct {
	Seq      uint64 `json:"seq"`
	Decision string `json:"decision"`
}

// TwoPhase is a prepared call's two-phase state, as call.get shows it.
type TwoPhase struct {
	// State is PhasePrepared, PhaseCommitted or PhaseAborted.
	State                string `json:"state"`
	CommitToken          string `json:"commit_token"`
	CommitDeadlineUnixMS int64  `json:"commit_deadline_unix_ms"`
	PreparedSeq          uint64 `json:"prepared_seq"`
	DecisionSeq          uint64 `json:"decision_seq,omitempty"`
	DecidedBy            string `json:"decided_by,omitempty"`
}

// CallView is call.get's answer: the call record, its operator's
// resolution if any and, for a prepared call, its two-phase state.
type CallView struct {
	CallRecord
	TwoPhase *TwoPhase `json:"two_phase,omitempty"`
	// Resolution is an operator's resolution of the call (call.resolve:
	// what became of an outcome_unknown call's side effect), with its
	// entry's seq; nil when there is none.
	Resolution *ResolutionEntry `json:"resolution,omitempty"`
	// Redrive is the call's redrive (call.redrive: the derived call that
	// runs it again), with its entry's seq; nil when there is none. Only a
	// failed or timed-out call has one.
	Redrive *RedriveEntry `json:"redrive,omitempty"`
	// RedrivenFrom is, for a derived call (<root>~r<n>), the call it was
	// redriven from; empty for any other.
	RedrivenFrom string `json:"redriven_from,omitempty"`
}

// ParsePrepare reads a prepare body, listing every violation.
func ParsePrepare(body []byte) (PrepareRequest, Violations) {
	var vs Violations
	var r PrepareRequest
	o, ok := ParseObject("body", body, &vs)
	if !ok {
		return r, vs
	}
	r.ProjectID, r.AgentTurnID, r.ToolCallID = o.Ident("project_id", true), o.Ident("agent_turn_id", true), o.Ident("tool_call_id", true)
	r.CommitToken = commitToken(o, &vs)
	r.CommitDeadlineUnixMS = nonNegative(o, "commit_deadline_unix_ms", &vs)
	switch raw := o.Raw("commit_deadline_unix_ms"); {
	case raw == nil:
		vs.Add(o.Path("commit_deadline_unix_ms"), VRequired, "is required")
	case string(raw) == "0":
		vs.Add(o.Path("commit_deadline_unix_ms"), VInvalidValue, "must be a time (unix milliseconds), not 0")
	}
	return r, vs
}

// ParseDecision reads a commit or abort body, listing every violation.
func ParseDecision(body []byte) (DecisionRequest, Violations) {
	var vs Violations
	var r DecisionRequest
	o, ok := ParseObject("body", body, &vs)
	if !ok {
		return r, vs
	}
	r.ProjectID, r.AgentID = o.Ident("project_id", true), o.Ident("agent_id", true)
	r.AgentTurnID, r.ToolCallID = o.Ident("agent_turn_id", true), o.Ident("tool_call_id", true)
	r.CommitToken = commitToken(o, &vs)
	return r, vs
}

// commitToken reads a required commit token: 1 to MaxCommitTokenLen
// printable ASCII characters, no spaces.
func commitToken(o JSONObject, vs *Violations) string {
	t := o.Str("commit_token", true)
	if t == "" {
		return t
	}
	if len(t) > MaxCommitTokenLen || strings.IndexFunc(t, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		vs.Add(o.Path("commit_token"), VInvalidValue, "must be 1 to %d printable ASCII characters without spaces", MaxCommitTokenLen)
	}
	return t
}
