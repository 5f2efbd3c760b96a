// Package projector is the read side of cgledger: it consumes the ledger
// stream in sequence order into Pebble views (CardStore, Inbox, call state,
// audit indexes, roster, hash-chain checkpoints), exactly once, and answers
// audit queries as of any ledger sequence or time.
package projector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cgledger/cgledger/internal/backoff"
	"github.com/cgledger/cgledger/stream"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/protocol"
)

// Config configures a Projector. Zero values mean the defaults.
type Config struct {
	// Stream is the ledger stream. Empty means stream.DefaultName.
	Stream string
	// BatchSize is the most entries applied in one Pebble batch. Zero means
	// 512. A batch is also committed whenever the projector reaches the
	// stream's tail, so a small ledger is never held back.
	BatchSize int
	// SyncEvery makes every SyncEvery-th batch, and every batch that reaches
	// the stream's tail, durable (fsync) before continuing. Zero means 16.
	// Other batches commit without fsync: a crash can roll them back (never
	// half of one), and the projector re-applies them; syncing bounds how
	// much a crash can undo and guarantees progress across repeated crashes.
	SyncEvery int
	// TailSyncInterval spaces out the fsyncs of batches that reach the tail
	// while Run follows the ledger: at most one per interval (CatchUp always
	// fsyncs at the tail). The stream is the source of truth, so a crash can
	// only roll the views back by that much, and they are re-applied. Zero
	// means 1s; a negative value fsyncs every tail batch.
	TailSyncInterval time.Duration
	// FollowLinger is how long Run, following the ledger, holds a batch
	// that reached the stream's tail open for the entries that arrive
	// right after (a tool call writes several within a millisecond), so
	// that they share one Pebble commit; BatchSize still ends a batch at
	// once. It delays the views by at most that much. Zero means 1ms; a
	// negative value commits every batch at the tail at once. CatchUp never
	// lingers.
	FollowLinger time.Duration
	// Registerer receives the projector's metrics. Nil keeps them unregistered.
	Registerer prometheus.Registerer
	// Logger receives operational logs. Nil discards them.
	Logger *slog.Logger
	// SkipPollInterval is how often WaitForSkip looks for a skip entry
	// while the projector is stopped on a corrupt entry. Zero means 2s: an
	// operator's skip takes effect within seconds, and a stalled projector
	// costs one direct get per interval.
	SkipPollInterval time.Duration
	// WriteGuard, when set, is asked before every commit; an error stops the
	// projector before it writes (it retries from its checkpoint later).
	// serve sets it to the data directory's free-space check, so the view
	// store is never written on a full disk. Nil means no check.
	WriteGuard func() error
	// Archive, when set, holds the entries the stream no longer keeps (its
	// retention window let them go): a projector whose views end before the
	// stream's first sequence reads them from there, then follows the
	// stream. Nil means a stream that starts after the views is a gap.
	Archive ArchiveReader
}

// ArchiveReader reads archived ledger entries in order (package archive's
// *Archive). A sequence it does not hold wraps stream.ErrHistoryLost.
type ArchiveReader interface {
	ReadRange(ctx context.Context, from, to uint64, fn func(protocol.Entry) error) error
	// LostAt returns the range recorded as lost (expired before it was
	// archived) that holds seq, if any: the projector records it and goes
	// on past it, as every rebuild from the same archive does.
	LostAt(seq uint64) (stream.LostRange, bool, error)
	// LastSeq is the last sequence the archive holds (0 for none).
	LastSeq() (uint64, error)
}

// Projector applies ledger entries to a Store.
type Projector struct {
	store *Store
	js    jetstream.JetStream
	cfg   Config
	// lastSync is when a batch was last fsynced (by consume only).
	lastSync time.Time
	m        *metrics
	log      *slog.Logger

	applied atomic.Uint64

	// afterCommit, when set (tests only), runs after each committed batch; an
	// error stops the projector there, as a crash would.
	afterCommit func(applied uint64) error
}

// New returns a projector writing to store from the ledger stream on js.
func New(store *Store, js jetstream.JetStream, cfg Config) (*Projector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("projector: %w", err)
	}
	if cfg.Stream == "" {
		cfg.Stream = stream.DefaultName
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 512
	}
	if cfg.SyncEvery <= 0 {
		cfg.SyncEvery = 16
	}
	if cfg.SkipPollInterval <= 0 {
		cfg.SkipPollInterval = 2 * time.Second
	}
	if cfg.TailSyncInterval == 0 {
		cfg.TailSyncInterval = time.Second
	}
	if cfg.FollowLinger == 0 {
		cfg.FollowLinger = time.Millisecond
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("projector: register metrics: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Projector{store: store, js: js, cfg: cfg, m: m, log: log}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(newLagCollector(p)); err != nil {
			return nil, fmt.Errorf("projector: register lag metrics: %w", err)
		}
	}
	cp, err := store.checkpoint()
	if err != nil {
		return nil, err
	}
	p.applied.Store(cp.Applied)
	m.appliedTo.Set(float64(cp.Applied))
	return p, nil
}

// Store is the projector's view store.
func (p *Projector) Store() *Store { return p.store }

// Applied is the last sequence committed to the views.
func (p *Projector) Applied() uint64 { return p.applied.Load() }

// Fatal reports whether err stops the projector (a gap or a corrupt entry)
// rather than a transient failure worth retrying. A gap stops it for good;
// a corrupt entry until an operator skips it (see WaitForSkip).
func Fatal(err error) bool {
	return errors.Is(err, ErrGap) || errors.Is(err, ErrCorruptEntry)
}

// WaitForSkip is what a long-running caller does after CatchUp or Run
// stopped with stop: when stop is a corrupt entry (ErrCorruptEntry), it
// polls the ledger stream every Config.SkipPollInterval for a valid skip
// entry naming the sequence the views stop before (Applied()+1), and returns
// nil as soon as there is one; the caller then calls CatchUp or Run again,
// which record that entry as skipped and go on. Any other stop (a gap,
// which no skip can mend, or nil) is returned as is, at once. It returns
// ctx's error when ctx ends first; lookup failures are logged and retried.
func (p *Projector) WaitForSkip(ctx context.Context, stop error) error {
	if !errors.Is(stop, ErrCorruptEntry) {
		return stop
	}
	seq := p.Applied() + 1
	p.log.Warn("projector: waiting for a skip entry (ledger.Ledger.Skip) for the entry it stopped on", "seq", seq, "poll", p.cfg.SkipPollInterval)
	for {
		_, found, err := p.findSkip(ctx, seq)
		if err == nil && found {
			p.log.Info("projector: skip entry found; resuming", "seq", seq)
			return nil
		}
		if err != nil && ctx.Err() == nil {
			p.log.Warn("projector: looking for a skip entry failed; will retry", "seq", seq, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.cfg.SkipPollInterval):
		}
	}
}

// findSkip looks up the skip entry for seq in the ledger stream.
func (p *Projector) findSkip(ctx context.Context, seq uint64) (protocol.SkipRecord, bool, error) {
	s, err := p.js.Stream(ctx, p.cfg.Stream)
	if err != nil {
		return protocol.SkipRecord{}, false, fmt.Errorf("projector: stream %s: %w", p.cfg.Stream, err)
	}
	return stream.FindSkip(ctx, s, seq)
}

// pendingEntry is an entry of the batch being built; skip is set when it is
// recorded as skipped rather than applied.
type pendingEntry struct {
	e    protocol.Entry
	skip *protocol.SkipRecord
}

// skipFinder looks up the skip entry of a sequence.
type skipFinder func(seq uint64) (protocol.SkipRecord, bool, error)

// applyOrSkip applies e after the pending entries of a's batch. When e
// cannot be applied and find has a skip entry for it, the batch is rebuilt
// from cp and pending (the failed apply may have left part of e in it) and
// e is recorded as skipped. It returns the applier to go on with.
func applyOrSkip(s *Store, a *applier, cp checkpoint, pending []pendingEntry, e protocol.Entry, find skipFinder) (*applier, pendingEntry, error) {
	pe := pendingEntry{e: e}
	err := a.apply(e)
	if err == nil || !errors.Is(err, ErrCorruptEntry) {
		return a, pe, err
	}
	rec, found, ferr := find(e.Seq)
	if ferr != nil {
		// Not fatal: whether the entry is skipped is not known yet.
		return a, pe, fmt.Errorf("projector: look for a skip of seq %d (%v): %w", e.Seq, err, ferr)
	}
	if !found {
		return a, pe, err
	}
	_ = a.b.Close()
	a = newApplierAfter(s, cp, a.prev)
	if err := reapply(a, pending); err != nil {
		return a, pe, err
	}
	pe.skip = &rec
	a.skipped(e, rec)
	return a, pe, nil
}

// reapply folds already-applied entries into a fresh batch.
func reapply(a *applier, pending []pendingEntry) error {
	for _, pe := range pending {
		if pe.skip != nil {
			a.skipped(pe.e, *pe.skip)
			continue
		}
		if err := a.apply(pe.e); err != nil {
			return fmt.Errorf("projector: re-apply seq %d: %w", pe.e.Seq, err)
		}
	}
	return nil
}

// CatchUp applies entries until the views include the stream's last
// sequence as of the call.
func (p *Projector) CatchUp(ctx context.Context) error {
	s, err := p.js.Stream(ctx, p.cfg.Stream)
	if err != nil {
		return fmt.Errorf("projector: stream %s: %w", p.cfg.Stream, err)
	}
	last := s.CachedInfo().State.LastSeq
	from := p.Applied()
	if from >= last {
		return nil
	}
	// A long catch-up (a restart after a crash, a rebuild) says how far it
	// is, so an operator never waits on a silent process.
	p.log.Info("projector catching up", "from_seq", from, "to_seq", last)
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(catchUpProgressEvery)
		defer t.Stop()
		start, prev := time.Now(), from
		for {
			select {
			case <-done:
				return
			case <-t.C:
				a := p.Applied()
				rate := float64(a-prev) / catchUpProgressEvery.Seconds()
				eta := "unknown"
				if rate > 0 && last > a {
					eta = time.Duration(float64(last-a) / rate * float64(time.Second)).Round(time.Second).String()
				}
				p.log.Info("projector catch-up progress", "applied_seq", a, "to_seq", last,
					"entries_per_s", int(rate), "elapsed", time.Since(start).Round(time.Millisecond).String(), "eta", eta)
				prev = a
			}
		}
	}()
	return p.consume(ctx, last)
}

// catchUpProgressEvery is how often a catch-up logs its progress.
const catchUpProgressEvery = 2 * time.Second

// Run applies entries as they arrive until ctx ends or a gap or corrupt
// entry stops it. Transient NATS failures are retried from the checkpoint.
// A corrupt entry that already has a skip entry is recorded as skipped; one
// that has none returns at once (see WaitForSkip).
func (p *Projector) Run(ctx context.Context) error {
	wait := backoff.New(50*time.Millisecond, 2*time.Second)
	for {
		err := p.consume(ctx, 0)
		if ctx.Err() != nil {
			return nil
		}
		if Fatal(err) || errors.Is(err, ErrStoreBroken) {
			return err
		}
		p.m.errors.WithLabelValues("nats").Inc()
		p.log.Warn("projector: consume failed; retrying from checkpoint", "err", err, "applied", p.Applied())
		if wait.Wait(ctx) != nil {
			return nil
		}
	}
}

// consume applies entries from the checkpoint on; until > 0 stops after
// that sequence.
func (p *Projector) consume(ctx context.Context, until uint64) error {
	cp, err := p.store.checkpoint()
	if err != nil {
		return err
	}
	s, err := p.js.Stream(ctx, p.cfg.Stream)
	if err != nil {
		return fmt.Errorf("projector: stream %s: %w", p.cfg.Stream, err)
	}
	var pending []pendingEntry
	batches := 0
	a := newApplier(p.store, cp)
	defer func() { _ = a.b.Close() }()
	// While catching up, one batch commits (Pebble's memtable inserts) while
	// the next is read and applied, on the other core. Following the tail,
	// every batch is committed before the next entry is read.
	var inflight *commitJob
	settle := func() error {
		if inflight == nil {
			return nil
		}
		err := <-inflight.done
		_ = inflight.a.b.Close()
		inflight = nil
		if err == nil {
			a.prev = nil
		}
		return err
	}
	defer func() { _ = settle() }()
	find := func(seq uint64) (protocol.SkipRecord, bool, error) { return p.findSkip(ctx, seq) }
	// commitNow commits the batch, whatever its size; numPending is how
	// many entries follow in the stream.
	commitNow := func(numPending uint64) (done bool, err error) {
		batches++
		atTail := numPending == 0
		sync := batches%p.cfg.SyncEvery == 0 ||
			(atTail && (until > 0 || p.cfg.TailSyncInterval < 0 || time.Since(p.lastSync) >= p.cfg.TailSyncInterval))
		if sync {
			p.lastSync = time.Now()
		}
		// One batch in flight at most: the next one's lookups see this
		// one's states through prev, and nothing older is uncommitted.
		if err := settle(); err != nil {
			return true, err
		}
		job := &commitJob{a: a, done: make(chan error, 1)}
		go func(sync bool) { job.done <- p.commit(job.a, sync) }(sync)
		inflight = job
		cp, pending = a.cp, pending[:0]
		a = newApplierAfter(p.store, cp, job.a)
		if atTail || p.afterCommit != nil || (until > 0 && cp.Applied >= until) {
			if err := settle(); err != nil {
				return true, err
			}
		}
		if p.afterCommit != nil {
			if err := p.afterCommit(cp.Applied); err != nil {
				return true, err
			}
		}
		if until > 0 && cp.Applied >= until {
			return true, nil
		}
		if until > 0 && numPending == 0 {
			// Nothing is left in the stream, yet the sequences up to
			// until were there when CatchUp began: they are missing.
			return true, p.stop(fmt.Errorf("%w: sequence %d is missing (the stream ends at %d)", ErrGap, cp.Applied+1, cp.Applied), "gap")
		}
		return false, nil
	}
	// handle applies one entry; numPending is how many follow it in the
	// stream, and flush commits the batch after it whatever its size.
	handle := func(e protocol.Entry, numPending uint64, flush bool) (done bool, err error) {
		var pe pendingEntry
		a, pe, err = applyOrSkip(p.store, a, cp, pending, e, find)
		if err != nil {
			// Commit the good entries of this batch so the views stop exactly
			// before the bad one.
			if serr := settle(); serr != nil {
				return true, errors.Join(err, serr)
			}
			if cerr := p.recommit(cp, pending); cerr != nil {
				return true, errors.Join(err, cerr)
			}
			if !Fatal(err) {
				return true, err
			}
			reason := "corrupt"
			if errors.Is(err, ErrGap) {
				reason = "gap"
			}
			return true, p.stop(err, reason)
		}
		if pe.skip != nil {
			p.log.Warn("projector: entry recorded as skipped, as a skip entry says", "seq", e.Seq, "skip_seq", pe.skip.SkipSeq, "reason", pe.skip.Reason)
		}
		pending = append(pending, pe)
		if len(pending) >= p.cfg.BatchSize || numPending == 0 || flush || (until > 0 && e.Seq >= until) {
			return commitNow(numPending)
		}
		return false, nil
	}
	// Entries the stream let go (its retention window) come from the
	// archive, up to to; stopped says the projector is done (CatchUp's end).
	// A range the archive records as lost is recorded and stepped over.
	fromArchive := func(to uint64, pendingAfter func(seq uint64) uint64) (stopped bool, err error) {
		if until > 0 {
			to = min(to, until)
		}
		for a.cp.Applied < to {
			from := a.cp.Applied + 1 // the applier's position, past a batch not yet committed
			p.log.Info("projector reading archived entries", "from_seq", from, "to_seq", to)
			err = p.cfg.Archive.ReadRange(ctx, from, to, func(e protocol.Entry) error {
				done, err := handle(e, pendingAfter(e.Seq), e.Seq == to)
				if err == nil && done {
					stopped = true
					return errArchiveDone
				}
				return err
			})
			switch {
			case stopped:
				return true, nil
			case errors.Is(err, stream.ErrHistoryLost):
				next := a.cp.Applied + 1
				lr, ok, lerr := p.cfg.Archive.LostAt(next)
				if lerr != nil {
					return true, lerr
				}
				if !ok {
					return true, p.stop(fmt.Errorf("%w: views end at seq %d, the stream no longer keeps seq %d, and the archive does not hold it: %v", ErrGap, next-1, next, err), "gap")
				}
				lr.First = next // the views may hold the start of the range
				p.log.Error("projector: stepping over entries lost before they were archived (the archive records them as lost)",
					"first_seq", lr.First, "last_seq", lr.Last, "link_known", lr.NextKnown)
				a.lost(lr)
				if a.cp.Applied >= to {
					if done, err := commitNow(pendingAfter(a.cp.Applied)); done || err != nil {
						return true, err
					}
				}
			case err != nil:
				return true, err
			}
		}
		return false, settle()
	}
	st := s.CachedInfo().State
	streamFirst := st.FirstSeq
	if st.Msgs == 0 {
		streamFirst = st.LastSeq + 1
	}
	pendingAfter := func(seq uint64) uint64 { return st.LastSeq - min(seq, st.LastSeq) }
	if p.cfg.Archive != nil {
		// What the archive holds past the views is read from it: the stream
		// may keep only some of it (tool definitions and roster entries
		// outlive the window; the entries between them do not).
		if archived, err := p.cfg.Archive.LastSeq(); err != nil {
			return err
		} else if archived > a.cp.Applied {
			if stopped, err := fromArchive(archived, pendingAfter); stopped || err != nil {
				return err
			}
		}
	}
	// With an archive, a stream that starts past the views is filled from
	// it when its first entry arrives (below); without one it is a gap.
	if streamFirst > a.cp.Applied+1 && p.cfg.Archive == nil {
		return p.stop(fmt.Errorf("%w: views end at seq %d but the stream starts at %d", ErrGap, cp.Applied, streamFirst), "gap")
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: cp.Applied + 1,
	})
	if err != nil {
		return fmt.Errorf("projector: consumer: %w", err)
	}
	if ci := cons.CachedInfo(); p.cfg.Archive != nil && ci != nil && ci.NumPending == 0 && st.LastSeq > a.cp.Applied {
		// Nothing from here on is left in the stream, yet it assigned
		// sequences up to its last: they expired, and the archive holds
		// none of them, so it must record them as lost.
		if stopped, err := fromArchive(st.LastSeq, pendingAfter); stopped || err != nil {
			return err
		}
	}
	// A read-ahead floor keeps tiny batch sizes from starving the client's
	// pull loop (which then waits out a missed heartbeat). A catch-up reads
	// further ahead: it knows the entries are there.
	pull := max(2*p.cfg.BatchSize, 256)
	if until > 0 {
		pull = max(pull, catchUpPull)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(pull))
	if err != nil {
		return fmt.Errorf("projector: messages: %w", err)
	}
	defer it.Stop()
	// A catch-up takes its entries from a goroutine that reads them ahead
	// (the client's delivery, metadata and entry on the other core) while
	// this one applies; following the tail, it reads them itself.
	var ahead *readAhead
	if until > 0 {
		ahead = startReadAhead(ctx, it, until)
		defer ahead.stop()
	}

	// Following the tail (until == 0), a batch that reached it is held open
	// until lingerUntil for the entries that arrive right after: a call
	// writes several entries together, and each commit costs a Pebble
	// write (and a memtable insert) whatever its size.
	linger := until == 0 && p.cfg.FollowLinger > 0
	var lingerUntil time.Time
	for {
		// Checked here too: Next returns an entry already pulled even when
		// ctx is done, and it would be applied first.
		if err := ctx.Err(); err != nil {
			return err
		}
		if ahead != nil {
			f, err := ahead.next()
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("projector: next entry: %w", err)
			}
			if f.e.Seq > a.cp.Applied+1 && p.cfg.Archive != nil {
				// Entries expired between the start of this read and
				// their delivery: they are in the archive.
				np := f.numPending
				if stopped, err := fromArchive(f.e.Seq-1, func(uint64) uint64 { return np + 1 }); stopped || err != nil {
					return err
				}
			}
			if done, err := handle(f.e, f.numPending, false); done || err != nil {
				return err
			}
			continue
		}
		var m jetstream.Msg
		if !lingerUntil.IsZero() {
			// NextMaxWait excludes NextContext: ctx is checked above, at
			// most one linger later.
			if wait := time.Until(lingerUntil); wait > 0 {
				m, err = it.Next(jetstream.NextMaxWait(wait))
			} else {
				err = nats.ErrTimeout
			}
			if errors.Is(err, nats.ErrTimeout) {
				lingerUntil = time.Time{}
				if done, err := commitNow(0); done || err != nil {
					return err
				}
				continue
			}
		} else {
			m, err = it.Next(jetstream.NextContext(ctx))
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("projector: next entry: %w", err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("projector: entry metadata: %w", err)
		}
		e := protocol.Entry{Seq: meta.Sequence.Stream, Subject: m.Subject(), Headers: m.Headers(), Data: m.Data(), Time: meta.Timestamp}
		if e.Seq > a.cp.Applied+1 && p.cfg.Archive != nil {
			// Entries expired between the start of this read and their
			// delivery: they are in the archive.
			if stopped, err := fromArchive(e.Seq-1, func(uint64) uint64 { return meta.NumPending + 1 }); stopped || err != nil {
				return err
			}
		}
		numPending := meta.NumPending
		hold := linger && numPending == 0
		if hold {
			// Not committed at the tail: the linger above commits it.
			numPending = 1
		}
		if done, err := handle(e, numPending, false); done || err != nil {
			return err
		}
		switch {
		case len(pending) == 0:
			lingerUntil = time.Time{}
		case hold && lingerUntil.IsZero():
			lingerUntil = time.Now().Add(p.cfg.FollowLinger)
		}
	}
}

// errArchiveDone ends an archive read once the projector is done.
var errArchiveDone = errors.New("archive read done")

// commitJob is a batch being committed while the next one is built.
type commitJob struct {
	a    *applier
	done chan error
}

func (p *Projector) commit(a *applier, sync bool) (err error) {
	if p.cfg.WriteGuard != nil {
		if gerr := p.cfg.WriteGuard(); gerr != nil {
			p.m.errors.WithLabelValues("store").Inc()
			return fmt.Errorf("projector: commit through seq %d not written: %w", a.cp.Applied, gerr)
		}
	}
	n := a.cp.Applied - p.Applied()
	start := time.Now()
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	defer func() {
		// Pebble gives up on a failed WAL write (a full or read-only disk)
		// by a fatal log, which panics: the process lives on, not ready,
		// with the cause in its readiness reason.
		if r := recover(); r != nil {
			sf, ok := r.(storeFatal)
			if !ok {
				panic(r)
			}
			p.m.errors.WithLabelValues("store").Inc()
			err = fmt.Errorf("projector: commit through seq %d: %w", a.cp.Applied, sf)
		}
	}()
	a.seal()
	if err := a.b.Commit(opts); err != nil {
		p.m.errors.WithLabelValues("store").Inc()
		return fmt.Errorf("projector: commit through seq %d: %w", a.cp.Applied, err)
	}
	a.committed()
	p.m.commit.Observe(time.Since(start).Seconds())
	p.applied.Store(a.cp.Applied)
	p.m.applied.Add(float64(n))
	p.m.appliedTo.Set(float64(a.cp.Applied))
	p.m.unrecognized.Add(float64(a.nUnrecognized))
	p.m.skipped.Add(float64(a.nSkipped))
	// Committing past the entry it stopped on (a skip) ends a stall.
	p.m.stalled.Set(0)
	return nil
}

// recommit re-applies the good entries of a failed batch in a fresh batch.
func (p *Projector) recommit(cp checkpoint, good []pendingEntry) error {
	if len(good) == 0 {
		return nil
	}
	a := newApplier(p.store, cp)
	defer func() { _ = a.b.Close() }()
	if err := reapply(a, good); err != nil {
		return err
	}
	return p.commit(a, true)
}

func (p *Projector) stop(err error, reason string) error {
	p.m.errors.WithLabelValues(reason).Inc()
	p.m.stalled.Set(1)
	p.log.Error("projector stopped; a gap is final, a corrupt entry waits for an operator's skip entry (ledger.Ledger.Skip)", "err", err, "applied", p.Applied())
	return err
}
