package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// callKey is the KV key of a call. Ids are base64url-encoded because
// identifiers may hold characters KV keys do not allow.
func callKey(project, turnID, callID string) string {
	return "call." + protocol.KeyToken(project) + "." + protocol.KeyToken(turnID) + "." + protocol.KeyToken(callID)
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
func (l *Ledger) getRecord(ctx context.Context, key string) (*protocol.CallRecord, uint64, error) {
	e, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read call record: %w", err)
	}
	var rec protocol.CallRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, 0, fmt.Errorf("decode call record rev %d: %w", e.Revision(), err)
	}
	l.cacheRecord(key, &rec, e.Revision())
	return &rec, e.Revision(), nil
}

// recordCached returns the record as this process last wrote or read it,
// reading it only when it has none. The answer may be behind the bucket
// (another process moved the call on): callers use it only where a
// compare-and-set or an expected-last-sequence append catches that, or for
// the fields dispatch fixed and nothing changes.
func (l *Ledger) recordCached(ctx context.Context, key string) (*protocol.CallRecord, uint64, error) {
	if c, ok := l.cache.records.get(key); ok {
		return cloneRecord(c.rec), c.rev, nil
	}
	return l.getRecord(ctx, key)
}

// cacheRecord remembers a record at a revision, unless a later revision is
// already remembered (a read can answer after a newer write), or the same
// revision with more than the bucket holds: the command's sequence from
// this process's publish, the wakeup from its report (the bucket holds
// neither, issue 30). Only a record whose command is published is
// remembered: until then its dispatch can still be refused and the record
// taken back and written anew, and no process may keep the first version.
func (l *Ledger) cacheRecord(key string, rec *protocol.CallRecord, rev uint64) {
	knowsMore := func(cur cachedRecord) bool {
		if cur.rev != rev {
			return cur.rev > rev
		}
		return (cur.rec.State == protocol.StateWoken && rec.State != protocol.StateWoken) ||
			(cur.rec.CommandSeq != 0 && rec.CommandSeq == 0)
	}
	if rec.CommandSeq == 0 && (rec.State == protocol.StateDispatched || rec.State == protocol.StateAwaitingApproval || rec.State == protocol.StatePaused) {
		// Nor one held: a resume moves it on without a command first, and
		// an earlier version remembered must not outlive that move.
		l.cache.records.dropUnless(key, knowsMore)
		return
	}
	l.cache.records.putUnlessNewer(key, cachedRecord{rec: cloneRecord(rec), rev: rev},
		func(cur, _ cachedRecord) bool { return knowsMore(cur) })
	if rec.State == protocol.StateWoken && rec.Claim != nil && rec.Claim.SourceID != protocol.DeadlineSourceID {
		l.keeperAcks.done(key)
	}
}

// cloneRecord copies a record deeply enough that the copy's state and claim
// can be changed without touching the original.
func cloneRecord(rec *protocol.CallRecord) *protocol.CallRecord {
	c := *rec
	if rec.Claim != nil {
		cl := *rec.Claim
		c.Claim = &cl
	}
	if rec.Held != nil {
		h := *rec.Held
		c.Held = &h
	}
	if rec.Paused != nil {
		p := *rec.Paused
		c.Paused = &p
	}
	return &c
}

// createRecord writes a new record. ok=false means the key already exists
// (JetStream reports that as 10071, not always ErrKeyExists). While another
// write of the key is in flight on a replicated bucket the server cannot tell
// yet (10164): the create waits for a definite answer (untilDecided).
func (l *Ledger) createRecord(ctx context.Context, key string, rec *protocol.CallRecord) (rev uint64, ok bool, err error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, false, fmt.Errorf("encode call record: %w", err)
	}
	if err := l.writable(); err != nil {
		return 0, false, err
	}
	rev, err = untilDecided(ctx, func() (uint64, error) { return l.kv.Create(ctx, key, b) })
	l.fault.note(err)
	if errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSeq(err) {
		l.cache.records.drop(key)
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("create call record: %w", err)
	}
	return rev, true, nil
}

// updateRecord compare-and-sets a record at revision rev. ok=false means
// another writer got there first; a write of the key still in flight is
// waited for (untilDecided), so ok=false is never a guess.
func (l *Ledger) updateRecord(ctx context.Context, key string, rec *protocol.CallRecord, rev uint64) (uint64, bool, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, false, fmt.Errorf("encode call record: %w", err)
	}
	if err := l.writable(); err != nil {
		return 0, false, err
	}
	nrev, err := untilDecided(ctx, func() (uint64, error) { return l.kv.Update(ctx, key, b, rev) })
	l.fault.note(err)
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || isWrongLastSeq(err) {
		l.cache.records.drop(key)
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("update call record: %w", err)
	}
	l.cacheRecord(key, rec, nrev)
	return nrev, true, nil
}

// GetCall returns the record of a call dispatched through the ledger, or an
// error matching ErrUnknownCall. Executors use it to skip calls already
// reported. The bucket keeps what dispatch fixed; whether the call is
// reported and woken is the stream's to tell (issue 30): a stored report
// shows as StateClaimed with its claim (sequence and outcome) read from the
// entry, and as StateWoken, with the wakeup's sequence, once its wakeup (or
// wakeup_skipped) entry is stored. A record marked woken by an earlier
// version is read as it is. The card's and the command's sequences are
// filled in from memory or the stream (callSequences).
func (l *Ledger) GetCall(ctx context.Context, project, turnID, callID string) (*protocol.CallRecord, error) {
	rec, err := l.getCall(ctx, project, turnID, callID, false)
	if err != nil {
		return rec, err
	}
	if rec.State == protocol.StateDispatched {
		confirmed, _, err := l.dispatchConfirmed(ctx, rec)
		if err != nil {
			return nil, fmt.Errorf("get call %s/%s: %w", turnID, callID, err)
		}
		if !confirmed {
			return nil, protocol.NewError(protocol.CodeUnknownCall, nil, "no call %s in turn %s of project %s was dispatched through the ledger", callID, turnID, project)
		}
	}
	if rec, err = l.streamView(ctx, rec, true); err != nil {
		return nil, fmt.Errorf("get call %s/%s: %w", turnID, callID, err)
	}
	if err := l.callSequences(ctx, rec); err != nil {
		return nil, fmt.Errorf("get call %s/%s: %w", turnID, callID, err)
	}
	if rec.Claim != nil {
		rec.Outcome = rec.Claim.AttemptOutcome
	}
	return rec, nil
}

func (l *Ledger) getCall(ctx context.Context, project, turnID, callID string, cached bool) (*protocol.CallRecord, error) {
	var vs protocol.Violations
	protocol.CheckIdent(&vs, "project_id", project, true)
	protocol.CheckIdent(&vs, "agent_turn_id", turnID, true)
	protocol.CheckIdent(&vs, "tool_call_id", callID, true)
	if err := protocol.BadRequest("call lookup", vs); err != nil {
		return nil, err
	}
	read := l.getRecord
	if cached {
		read = l.recordCached
	}
	rec, _, err := read(ctx, callKey(project, turnID, callID))
	if err != nil {
		return nil, fmt.Errorf("get call %s/%s: %w", turnID, callID, err)
	}
	if rec == nil {
		return nil, protocol.NewError(protocol.CodeUnknownCall, nil, "no call %s in turn %s of project %s was dispatched through the ledger", callID, turnID, project)
	}
	if rec, err = l.settleHeld(ctx, rec); err != nil {
		return nil, fmt.Errorf("get call %s/%s: %w", turnID, callID, err)
	}
	return rec, nil
}
