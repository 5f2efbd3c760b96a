package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Call record states, in the order a call moves through them.
const (
	StateDispatched = "dispatched" // command published (or about to be)
	StateClaimed    = "claimed"    // a report won the dedup claim; its entry may or may not be appended yet
	StateWoken      = "woken"      // report appended and wakeup published (or recorded as skipped)
)

// CallRecord is the KV record of one call, keyed by (project_id,
// agent_turn_id, tool_call_id). Dispatch creates it; the report path moves it
// forward with compare-and-set updates, which is what makes the report
// exactly-once (docs/report-path.md).
type CallRecord struct {
	State          string       `json:"state"`
	ProjectID      string       `json:"project_id"`
	ChannelID      string       `json:"channel_id"`
	AgentID        string       `json:"agent_id"`
	AgentTurnID    string       `json:"agent_turn_id"`
	TurnEpoch      uint64       `json:"turn_epoch"`
	ToolCallID     string       `json:"tool_call_id"`
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
}

// callKey is the KV key of a call. Ids are base64url-encoded because
// identifiers may hold characters KV keys do not allow.
func callKey(project, turnID, callID string) string {
	return "call." + keyToken(project) + "." + keyToken(turnID) + "." + keyToken(callID)
}

// fingerprint hashes parts with separators so that different splits of the
// same text never collide.
func fingerprint(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// getRecord reads a call record and its revision; (nil, 0, nil) when absent.
func (l *Ledger) getRecord(ctx context.Context, key string) (*CallRecord, uint64, error) {
	e, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read call record: %w", err)
	}
	var rec CallRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, 0, fmt.Errorf("decode call record rev %d: %w", e.Revision(), err)
	}
	return &rec, e.Revision(), nil
}

// createRecord writes a new record. ok=false means the key already exists
// (JetStream reports that as 10071 or 10164, not always ErrKeyExists).
func (l *Ledger) createRecord(ctx context.Context, key string, rec *CallRecord) (rev uint64, ok bool, err error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, false, fmt.Errorf("encode call record: %w", err)
	}
	rev, err = l.kv.Create(ctx, key, b)
	if errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSeq(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("create call record: %w", err)
	}
	return rev, true, nil
}

// updateRecord compare-and-sets a record at revision rev. ok=false means
// another writer got there first.
func (l *Ledger) updateRecord(ctx context.Context, key string, rec *CallRecord, rev uint64) (uint64, bool, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, false, fmt.Errorf("encode call record: %w", err)
	}
	nrev, err := l.kv.Update(ctx, key, b, rev)
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || isWrongLastSeq(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("update call record: %w", err)
	}
	return nrev, true, nil
}

// GetCall returns the record of a call dispatched through the ledger, or an
// error matching ErrUnknownCall. Executors use it to skip calls already reported.
func (l *Ledger) GetCall(ctx context.Context, project, turnID, callID string) (*CallRecord, error) {
	var vs Violations
	checkIdent(&vs, "project_id", project, true)
	checkIdent(&vs, "agent_turn_id", turnID, true)
	checkIdent(&vs, "tool_call_id", callID, true)
	if err := badRequest("call lookup", vs); err != nil {
		return nil, err
	}
	rec, _, err := l.getRecord(ctx, callKey(project, turnID, callID))
	if err != nil {
		return nil, fmt.Errorf("get call %s/%s: %w", turnID, callID, err)
	}
	if rec == nil {
		return nil, newError(CodeUnknownCall, nil, "no call %s in turn %s of project %s was dispatched through the ledger", callID, turnID, project)
	}
	return rec, nil
}
