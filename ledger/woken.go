package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cgledger/cgledger/internal/backoff"
	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// A call is woken when its wakeup (or wakeup_skipped) entry is stored: the
// entry is the mark (issue 30). The report path writes no record after the
// dispatch's create; readers find the wakeup in the stream (wakeupOf), and
// the process that published it keeps the woken record in memory.

// wakeupFound is a call's wakeup as the stream holds it.
type wakeupFound struct {
	seq     uint64
	subject string
	target  string
	skipped bool
}

// wakeupNear is how many entries after its report a call's wakeup is looked
// for by sequence, all at once: its writer publishes it right after the
// report, so it is normally among them.
const wakeupNear = 8

// wakeupOf finds the wakeup of a call's report (stored at reportSeq): its
// wakeup_skipped entry by the call's own subject, or its result wakeup
// after the report, reading the entries by sequence, wakeupNear at once,
// up to the stream's last sequence when the read went past the first ones
// (it is normally among them). The result wakeup is the entry on the
// channel's wakeup subjects naming the call whose report_seq is reportSeq
// (not a prepared call's phase wakeup). Nil when there is none (yet).
//
// Not a direct get with next-by-subject on the channel's wakeup subjects:
// with a wildcard the server matches every subject of a block for each get,
// and the calls' subjects are nearly all different (measured: milliseconds
// of server CPU per get once the stream holds some thousands of calls).
func (l *Ledger) wakeupOf(ctx context.Context, rec *protocol.CallRecord, reportSeq uint64) (*wakeupFound, error) {
	sk, err := l.lastForSubject(ctx, protocol.WakeupSkippedSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil {
		return nil, fmt.Errorf("find the wakeup of call %s: %w", rec.ToolCallID, err)
	}
	if sk != nil {
		return &wakeupFound{seq: sk.Sequence, skipped: true}, nil
	}
	var last uint64
	for from := reportSeq + 1; ; from += wakeupNear {
		w, err := l.wakeupIn(ctx, rec, reportSeq, from)
		if err != nil || w != nil {
			return w, err
		}
		if last == 0 {
			// Not right after the report: bound the read by the stream's
			// last sequence now, so a missing wakeup does not chase the
			// tail.
			info, err := l.stream.Info(ctx)
			if err != nil {
				return nil, fmt.Errorf("find the wakeup of call %s: %w", rec.ToolCallID, err)
			}
			last = info.State.LastSeq
		}
		if from+wakeupNear > last {
			return nil, nil
		}
	}
}

// wakeupIn looks for the wakeup of the report at reportSeq among the
// wakeupNear entries from from, read by sequence, concurrently (one round
// trip of latency).
func (l *Ledger) wakeupIn(ctx context.Context, rec *protocol.CallRecord, reportSeq, from uint64) (*wakeupFound, error) {
	var msgs [wakeupNear]*jetstream.RawStreamMsg
	var errs [wakeupNear]error
	var wg sync.WaitGroup
	for i := range wakeupNear {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs[i], errs[i] = l.stream.GetMsg(ctx, from+uint64(i))
		}()
	}
	wg.Wait()
	for i := range wakeupNear {
		if errors.Is(errs[i], jetstream.ErrMsgNotFound) {
			continue
		}
		if errs[i] != nil {
			return nil, fmt.Errorf("find the wakeup of call %s: %w", rec.ToolCallID, errs[i])
		}
		if w, ok := resultWakeup(msgs[i], rec.AgentTurnID, rec.ToolCallID, reportSeq); ok {
			return w, nil
		}
	}
	return nil, nil
}

// resultWakeup reads m as the result wakeup of call turnID/callID's report
// at reportSeq.
func resultWakeup(m *jetstream.RawStreamMsg, turnID, callID string, reportSeq uint64) (*wakeupFound, bool) {
	if kind, _, _, _ := protocol.ReportSweepEntry(m.Subject); kind != protocol.SubjectWakeup {
		return nil, false
	}
	if protocol.HeaderGet(m.Header, protocol.HeaderAgentTurnID) != turnID || protocol.HeaderGet(m.Header, protocol.HeaderToolCallID) != callID {
		return nil, false
	}
	var e protocol.WakeupEntry
	if json.Unmarshal(m.Data, &e) != nil || e.Phase != "" || e.ReportSeq != reportSeq {
		return nil, false
	}
	return &wakeupFound{seq: m.Sequence, subject: m.Subject, target: e.WorkerTarget}, true
}

// withWakeup fills c's wakeup fields from w.
func withWakeup(c *protocol.Claim, w *wakeupFound) {
	c.WakeupSubject, c.WorkerTarget, c.WakeupSeq, c.WakeupSkipped = w.subject, w.target, w.seq, w.skipped
	if w.skipped {
		c.WakeupSubject, c.WorkerTarget, c.WakeupSeq = "", "", 0
	}
}

// takeoverMark reports a record a takeover has locked (takeOver): claimed,
// with the stored report's sequence. A claim written by an earlier version
// before its append has no sequence.
func takeoverMark(rec *protocol.CallRecord) bool {
	return rec.State == protocol.StateClaimed && rec.Claim != nil && rec.Claim.Seq != 0
}

// reportable reports a record state a stored report may stand behind: the
// bucket keeps what dispatch (or an approval, a pause) wrote, and the stream
// says whether the call is reported and woken.
func reportable(rec *protocol.CallRecord) bool {
	switch rec.State {
	case protocol.StateDispatched, protocol.StatePaused, protocol.StateAwaitingApproval:
		return true
	}
	return takeoverMark(rec)
}

// streamView is rec as the stream tells it: for a record whose state the
// bucket cannot tell (reportable), a stored report makes it claimed with the
// report's claim and, when wake is set and the wakeup is stored, woken with
// the wakeup's sequence. A record already woken (this process's memory, or a
// mark of an earlier version) is returned as it is.
func (l *Ledger) streamView(ctx context.Context, rec *protocol.CallRecord, wake bool) (*protocol.CallRecord, error) {
	if !reportable(rec) {
		return rec, nil
	}
	if c, ok := l.cache.records.get(callKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)); ok && c.rec.State == protocol.StateWoken {
		// Woken is final: this process stored the wakeup, or read it.
		return cloneRecord(c.rec), nil
	}
	m, err := l.lastForSubject(ctx, protocol.ReportSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil || m == nil {
		return rec, err
	}
	c, err := l.claimFromEntry(m)
	if err != nil {
		return nil, err
	}
	c.LeaseUntil = time.Time{}
	view := cloneRecord(rec)
	view.State, view.Claim = protocol.StateClaimed, c
	if !wake {
		return view, nil
	}
	w, err := l.wakeupOf(ctx, rec, m.Sequence)
	if err != nil || w == nil {
		return view, err
	}
	withWakeup(c, w)
	view.State = protocol.StateWoken
	return view, nil
}

// wokenRecord is next (the record with the accepted claim) woken by w.
func wokenRecord(next *protocol.CallRecord, w *wakeupFound) *protocol.CallRecord {
	r := cloneRecord(next)
	withWakeup(r.Claim, w)
	r.State = protocol.StateWoken
	r.Claim.Header, r.Claim.Data, r.Claim.LeaseUntil = nil, nil, time.Time{}
	return r
}

// awaitWoken waits for the wakeup of the report stored at claim.Seq, which
// another caller stored and so publishes: true with the woken record once
// the stream holds it; false once the lease has passed without it (the
// entry's lease, or a takeover's, whichever ends later: its writer crashed
// or stalled). rec is the record as last read. Polling, rather than a
// watch, because it only runs for concurrent identical reports.
func (l *Ledger) awaitWoken(ctx context.Context, rec *protocol.CallRecord, claim *protocol.Claim) (bool, *protocol.CallRecord, error) {
	leaseUntil := claim.LeaseUntil
	if takeoverMark(rec) && rec.Claim.LeaseUntil.After(leaseUntil) {
		leaseUntil = rec.Claim.LeaseUntil
	}
	for wait := backoff.New(time.Millisecond, 100*time.Millisecond); ; {
		w, err := l.wakeupOf(ctx, rec, claim.Seq)
		if err != nil {
			return false, nil, err
		}
		if w != nil {
			next := cloneRecord(rec)
			next.Claim = claim
			return true, wokenRecord(next, w), nil
		}
		if !time.Now().Before(leaseUntil) {
			return false, nil, nil
		}
		if err := wait.WaitUntil(ctx, leaseUntil); err != nil {
			return false, nil, fmt.Errorf("waiting for the report being finished: %w", err)
		}
	}
}

// lockTakeover is the lock of a takeover: a compare-and-set of the call
// record at revision rev (as read, behind the wait for the wakeup) to
// claimed with the stored report's claim and a lease of its own. Of any
// number of callers taking over one report, through any number of
// processes, one wins (ok) and publishes the wakeup; the others re-read and
// find the mark, whose lease they wait out before another takeover. It is
// the only bucket write of the report path, and only for a report whose
// writer crashed or stalled.
func (l *Ledger) lockTakeover(ctx context.Context, key string, rec *protocol.CallRecord, rev uint64, claim *protocol.Claim) (uint64, bool, error) {
	mark := cloneRecord(rec)
	c := *claim
	c.Header, c.Data, c.ErrorCode = nil, nil, ""
	c.LeaseUntil = time.Now().Add(l.lease)
	mark.State, mark.Claim = protocol.StateClaimed, &c
	nrev, ok, err := l.updateRecord(ctx, key, mark, rev)
	if err != nil || !ok {
		return 0, false, err
	}
	if err := l.step(stepMarkedWoken); err != nil {
		return 0, false, err
	}
	return nrev, true, nil
}

// callSequences fills a call view's card and command sequences, which the
// bucket does not hold (the record is not written after its create, issue
// 30): from this process's memory (its dispatch), else from the stream: the
// tool.call card by its id, and the command after it on the call's command
// subject (commandEntry). Only GetCall (call.get) and an executor's read of
// a redelivered command pay the reads; a held call (paused or awaiting
// approval) has no command yet.
func (l *Ledger) callSequences(ctx context.Context, rec *protocol.CallRecord) error {
	if rec.CardSeq != 0 && rec.CommandSeq != 0 {
		return nil
	}
	if c, ok := l.cache.records.get(callKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)); ok && c.rec.CommandSeq != 0 && c.rec.CardSeq != 0 {
		rec.CardSeq, rec.CommandSeq = c.rec.CardSeq, c.rec.CommandSeq
		return nil
	}
	if rec.CardSeq == 0 {
		sc, err := l.cardCached(ctx, rec.ProjectID, rec.ToolCallCardID)
		if err != nil {
			return fmt.Errorf("read the tool.call card of call %s: %w", rec.ToolCallID, err)
		}
		rec.CardSeq = sc.Seq
	}
	if rec.CommandSeq != 0 || rec.State == protocol.StatePaused || rec.State == protocol.StateAwaitingApproval {
		return nil
	}
	m, err := l.commandEntry(ctx, rec, 0)
	if err != nil || m == nil {
		return err
	}
	rec.CommandSeq = m.Sequence
	return nil
}
