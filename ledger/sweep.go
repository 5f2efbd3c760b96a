package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultSweepInterval is how often a Sweeper sweeps after its first sweep
// at start.
const DefaultSweepInterval = time.Minute

// SweepConfig configures a Sweeper.
type SweepConfig struct {
	// Interval is the time between two sweeps, after the one at start.
	// Zero means DefaultSweepInterval.
	Interval time.Duration
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass;
// StartSweeper calls it.
func (c SweepConfig) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "Interval", c.Interval)
	return protocol.BadRequest("sweep config", vs)
}

// SweepResult is what one sweep read and did.
type SweepResult struct {
	// From and To are the sequences the sweep read between (To is the
	// stream's last sequence when it began; 0 when there was nothing).
	From, To uint64
	// Reports is how many report entries it read; Finished how many of them
	// had no wakeup after their lease, and were finished by it; Pending how
	// many were younger than the lease (or could not be finished now) and
	// are read again by the next sweep.
	Reports, Finished, Pending int
	// Watermark is the sequence every report up to which is settled, stored
	// for the next sweep.
	Watermark uint64
}

// sweepKey is the bucket key of the sweep's watermark: one per ledger
// (protocol version), written once per sweep, never per call.
func (l *Ledger) sweepKey() string { return "sweep." + l.version }

type sweepMark struct {
	Seq uint64 `json:"seq"`
}

// Sweep finishes the reports whose wakeup is missing (their writer crashed
// or stalled after the append, and no retry, Resume or redelivery came):
// it reads the report, wakeup and wakeup_skipped entries stored since the
// watermark, and for each report older than the lease with no wakeup
// replays it as Resume does, which takes it over behind the call record's
// compare-and-set (any number of sweeps and reports racing for one report
// publish one wakeup). It then stores the watermark past every report that
// is settled.
func (l *Ledger) Sweep(ctx context.Context) (SweepResult, error) {
	var res SweepResult
	mark, markRev, err := l.readSweepMark(ctx)
	if err != nil {
		return res, err
	}
	info, err := l.stream.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("sweep: %w", err)
	}
	last := info.State.LastSeq
	from := max(mark+1, info.State.FirstSeq, 1)
	res.From, res.To, res.Watermark = from, last, mark
	if last < from || info.State.Msgs == 0 {
		return res, nil
	}
	type report struct {
		seq uint64
		at  time.Time
		key string
	}
	var reports []report
	// woke is the last wakeup (or wakeup_skipped) sequence read per call: a
	// report is settled by one stored after it. A prepared call's or an
	// approval's phase wakeup comes before its report, so the entries'
	// subjects and headers are enough: the read takes headers only, and
	// decodes nothing but the few reports left unsettled.
	woke := map[string]uint64{}
	key := func(project, turn, call string) string { return project + " " + turn + " " + call }
	err = l.readOrdered(ctx, from, last, true, func(m jetstream.Msg, seq uint64, at time.Time) bool {
		kind, project, turn, call := protocol.ReportSweepEntry(m.Subject())
		switch kind {
		case protocol.SubjectReport:
			if t, ok := protocol.EntryTime(m.Headers()); ok {
				at = t
			}
			reports = append(reports, report{seq: seq, at: at, key: key(project, turn, call)})
		case protocol.SubjectWakeup:
			h := m.Headers()
			woke[key(project, protocol.HeaderGet(h, protocol.HeaderAgentTurnID), protocol.HeaderGet(h, protocol.HeaderToolCallID))] = seq
		case protocol.SubjectWakeupSkip:
			woke[key(project, turn, call)] = seq
		}
		return false
	})
	if err != nil {
		return res, fmt.Errorf("sweep: %w", err)
	}
	res.Reports = len(reports)
	// The watermark stops before the first report still unsettled.
	keep := last + 1
	now := time.Now()
	for _, r := range reports {
		if woke[r.key] > r.seq {
			continue
		}
		if now.Before(r.at.Add(l.lease)) {
			// Its writer may be publishing the wakeup now.
			res.Pending++
			keep = min(keep, r.seq)
			continue
		}
		m, err := l.stream.GetMsg(ctx, r.seq)
		if err != nil {
			if ctx.Err() != nil {
				return res, fmt.Errorf("sweep: %w", ctx.Err())
			}
			l.log.Warn("sweep: read a report entry", "seq", r.seq, "err", err)
			res.Pending++
			keep = min(keep, r.seq)
			continue
		}
		var e protocol.ReportEntry
		if err := json.Unmarshal(m.Data, &e); err != nil {
			l.log.Warn("sweep: a report entry that does not decode", "seq", r.seq, "err", err)
			continue
		}
		finished, err := l.sweepOne(ctx, &e)
		if err != nil {
			if ctx.Err() != nil {
				return res, fmt.Errorf("sweep: %w", ctx.Err())
			}
			l.log.Warn("sweep: finish a report", "seq", r.seq, "call", e.ToolCallID, "err", err)
			res.Pending++
			keep = min(keep, r.seq)
			continue
		}
		if finished {
			res.Finished++
		}
	}
	res.Watermark = max(mark, keep-1)
	if res.Watermark > mark {
		if err := l.writeSweepMark(ctx, res.Watermark, markRev); err != nil {
			return res, err
		}
	}
	return res, nil
}

// sweepOne replays a stored report whose wakeup the sweep did not find, as
// Resume does: true when this sweep published its wakeup. A report that can
// no longer be replayed (its record expired, or it is refused) has nothing
// left to finish and is settled.
func (l *Ledger) sweepOne(ctx context.Context, e *protocol.ReportEntry) (bool, error) {
	in, ok := reportFromRequest(protocol.ReportRequest{
		ProjectID: e.ProjectID, ChannelID: e.ChannelID, SourceID: e.SourceID, SourceFunction: e.SourceFunction,
		Identity: protocol.Identity{AgentID: e.AgentID, AgentTurnID: e.AgentTurnID, TurnEpoch: e.TurnEpoch, ToolCallID: e.ToolCallID, StepID: e.StepID},
		Payload:  protocol.ReportPayload{Status: e.Status, AfterExecution: e.AfterExecution, ToolResultCardID: e.ToolResultCardID, StepID: e.StepID, AttemptOutcome: e.AttemptOutcome},
	})
	if !ok {
		l.log.Warn("sweep: a stored report that does not replay", "call", e.ToolCallID)
		return false, nil
	}
	in.swept = true
	// The ledger's own reports replay as the ledger made them: the
	// deadline's timeout (a paused call's too), an approval's end of a held
	// call.
	in.deadline = e.SourceID == protocol.DeadlineSourceID
	in.approval = e.SourceID == protocol.LedgerSourceID
	_, err := l.report(ctx, nil, in, func() protocol.RejectedRequest { return protocol.RejectedRequest{} })
	if _, refused := protocol.AsError(err); refused {
		l.log.Warn("sweep: a stored report the ledger refuses to finish", "call", e.ToolCallID, "err", err)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return in.tookOver, nil
}

// readOrdered calls fn for every entry from from to last, in order, until
// it returns true; with the headers only when headersOnly. It is an ordered
// consumer taking the whole stream: one filtered on a few kinds of
// subject would make the server match every subject of each block for
// each entry, the calls' subjects being nearly all different.
func (l *Ledger) readOrdered(ctx context.Context, from, last uint64, headersOnly bool, fn func(m jetstream.Msg, seq uint64, at time.Time) bool) error {
	cons, err := l.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from,
		HeadersOnly: headersOnly, InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("read the stream: consumer: %w", err)
	}
	defer func() {
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = l.stream.DeleteConsumer(dctx, info.Name)
			cancel()
		}
	}()
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		return nil
	}
	next, empty := from, 0
	for {
		// Entries are pending (above, and NumPending of the last one
		// read): a fetch that waits returns them as they come.
		batch, err := cons.Fetch(1024, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read the stream: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("read the stream: metadata: %w", err)
			}
			seq := meta.Sequence.Stream
			if seq > last {
				return nil
			}
			next = seq + 1
			if fn(m, seq, meta.Timestamp) || seq == last || meta.NumPending == 0 {
				return nil
			}
		}
		// No responders: the fetch's pull request reached a server that
		// did not know its consumer yet (below).
		berr := batch.Error()
		lostPull := errors.Is(berr, nats.ErrNoResponders)
		if berr != nil && !lostPull && !errors.Is(berr, jetstream.ErrNoMessages) {
			return fmt.Errorf("read the stream: %w", berr)
		}
		if n > 0 {
			empty = 0
		} else {
			// Each ordered fetch reads with a consumer of its own, made
			// from the entry after the last one read: when that consumer
			// had nothing pending, nothing is left (the rest expired).
			if info := cons.CachedInfo(); !lostPull && info != nil && info.NumPending == 0 {
				return nil
			}
			// Entries are left and none came: the fetch's pull request was
			// lost or the server took longer than the wait. In a cluster,
			// a new consumer's creation is answered over the system
			// account's route, which can overtake its interest on the
			// account's own route: its first pull request then finds no
			// responder. Ending here would let the sweep store its
			// watermark past reports it never read: the read fetches
			// again, and after readOrderedEmptyFetches fails.
			empty++
			if empty >= readOrderedEmptyFetches {
				return fmt.Errorf("read the stream: no entry from seq %d in %d fetches though entries are left", next, empty)
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// readOrderedEmptyFetches is how many fetches in a row readOrdered lets
// come back empty, entries being left, before it fails: a lost pull
// request costs one, and each fetch makes a new consumer.
const readOrderedEmptyFetches = 5

// sweptWithin reports whether the watermark was stored less than d ago (by
// any process). A failed read says no: the sweep then reads it again.
func (l *Ledger) sweptWithin(ctx context.Context, d time.Duration) bool {
	e, err := l.kv.Get(ctx, l.sweepKey())
	return err == nil && time.Since(e.Created()) < d
}

func (l *Ledger) readSweepMark(ctx context.Context) (uint64, uint64, error) {
	e, err := l.kv.Get(ctx, l.sweepKey())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("sweep: read the watermark: %w", err)
	}
	var m sweepMark
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return 0, 0, fmt.Errorf("sweep: decode the watermark (rev %d): %w", e.Revision(), err)
	}
	return m.Seq, e.Revision(), nil
}

// writeSweepMark stores the watermark seq over the one read at rev: a
// sweep that lost the race to another (which stored a watermark of its
// own) leaves it, so the watermark only moves forward.
func (l *Ledger) writeSweepMark(ctx context.Context, seq, rev uint64) error {
	b, err := json.Marshal(sweepMark{Seq: seq})
	if err != nil {
		return err
	}
	if err := l.writable(); err != nil {
		return err
	}
	if rev == 0 {
		_, err = l.kv.Create(ctx, l.sweepKey(), b)
	} else {
		_, err = l.kv.Update(ctx, l.sweepKey(), b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || isWrongLastSeq(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sweep: store the watermark %s: %w", strconv.FormatUint(seq, 10), err)
	}
	return nil
}

// Sweeper runs Sweep at start and then every Interval, until stopped.
type Sweeper struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// StartSweeper starts sweeping: at once, then every cfg.Interval. Every
// serve process that serves the API runs one: sweeps racing on one ledger
// stay exact (Sweep). Stop it with Stop.
func (l *Ledger) StartSweeper(ctx context.Context, cfg SweepConfig) (*Sweeper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sweeper: %w", err)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultSweepInterval
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Sweeper{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTimer(0)
		defer t.Stop()
		first := true
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !first && l.sweptWithin(ctx, cfg.Interval/2) {
				// Another process swept a moment ago: every process
				// sweeping each interval would read each entry once per
				// process.
				t.Reset(cfg.Interval)
				continue
			}
			first = false
			res, err := l.Sweep(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				l.log.Warn("sweep", "err", err)
			case res.Finished > 0:
				l.log.Info("sweep finished reports whose wakeup was missing", "finished", res.Finished, "from", res.From, "to", res.To)
			}
			t.Reset(cfg.Interval)
		}
	}()
	return s, nil
}

// Stop stops the sweeper and waits (up to ctx) for a sweep under way.
func (s *Sweeper) Stop(ctx context.Context) error {
	s.once.Do(s.cancel)
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop sweeper: %w", ctx.Err())
	}
}
