package projector

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cgledger/cgledger/protocol"
)

// DefaultBatchSize is the projector's batch size when Config.BatchSize is
// zero; an EntryApplier given no size uses it too.
const DefaultBatchSize = 512

// EntryApplier applies ledger entries held in memory to a Store without
// NATS, exactly as the projector applies them from the stream (the same
// rows, digest and checkpoint): in batches, committing one batch (without
// fsync) while it builds the next, as a catch-up does. It is what a replay
// projects its file with, and the floor `cgledger bench --rebuild` holds a
// rebuild against. It is not safe for concurrent use.
//
// An entry it cannot apply (a gap, a corrupt entry) stops it: the entries
// before it are committed, so the store stops exactly before it, and every
// later Apply returns the same error. It finds no skip entries (they follow
// the entry they skip): a projector catching up from the store's checkpoint
// records those.
type EntryApplier struct {
	s       *Store
	batch   int
	find    skipFinder
	cp      checkpoint
	a       *applier
	pending []pendingEntry
	// inflight is the batch being committed while the next is built.
	inflight *commitJob
	applied  atomic.Uint64
	err      error
}

// NewEntryApplier returns an applier continuing s from its checkpoint, in
// batches of batch entries (zero or less means DefaultBatchSize).
func NewEntryApplier(s *Store, batch int) (*EntryApplier, error) {
	return newEntryApplier(s, batch, func(uint64) (protocol.SkipRecord, bool, error) {
		return protocol.SkipRecord{}, false, nil
	})
}

func newEntryApplier(s *Store, batch int, find skipFinder) (*EntryApplier, error) {
	if batch <= 0 {
		batch = DefaultBatchSize
	}
	cp, err := s.checkpoint()
	if err != nil {
		return nil, fmt.Errorf("projector: apply entries: %w", err)
	}
	x := &EntryApplier{s: s, batch: batch, find: find, cp: cp, a: newApplier(s, cp)}
	x.applied.Store(cp.Applied)
	return x, nil
}

// Applied is the last sequence committed to the store (safe to call from
// any goroutine).
func (x *EntryApplier) Applied() uint64 { return x.applied.Load() }

// Apply folds entries, which must continue the store's sequence, into the
// views; full batches are committed as they fill.
func (x *EntryApplier) Apply(entries ...protocol.Entry) error {
	if x.err != nil {
		return x.err
	}
	for _, e := range entries {
		var pe pendingEntry
		var err error
		if x.a, pe, err = applyOrSkip(x.s, x.a, x.cp, x.pending, e, x.find); err != nil {
			return x.fail(err)
		}
		x.pending = append(x.pending, pe)
		if len(x.pending) >= x.batch {
			if err := x.commit(); err != nil {
				return x.fail(err)
			}
		}
	}
	return nil
}

// Close commits what is pending and waits for every commit; the applier is
// done. It returns the error that stopped the applier, if any.
func (x *EntryApplier) Close() error {
	defer func() { _ = x.a.b.Close() }()
	if x.err != nil {
		return x.err
	}
	if len(x.pending) > 0 {
		if err := x.commit(); err != nil {
			return x.fail(err)
		}
	}
	if err := x.settle(); err != nil {
		return x.fail(err)
	}
	return nil
}

// fail records err as what stopped the applier, after committing the good
// entries of the batch it stopped in.
func (x *EntryApplier) fail(err error) error {
	if serr := x.settle(); serr != nil {
		err = errors.Join(err, serr)
	} else if len(x.pending) > 0 {
		a := newApplier(x.s, x.cp)
		rerr := reapply(a, x.pending)
		if rerr == nil {
			rerr = commitApplier(a)
		}
		_ = a.b.Close()
		if rerr != nil {
			err = errors.Join(err, rerr)
		} else {
			x.applied.Store(a.cp.Applied)
		}
		x.pending = x.pending[:0]
	}
	x.err = err
	return err
}

// commit starts committing the current batch and starts the next one; the
// batch before it is settled first, so one commit at most is in flight and
// the next batch's lookups see it through prev.
func (x *EntryApplier) commit() error {
	if err := x.settle(); err != nil {
		return err
	}
	job := &commitJob{a: x.a, done: make(chan error, 1)}
	go func() { job.done <- commitApplier(job.a) }()
	x.inflight = job
	x.cp, x.pending = x.a.cp, x.pending[:0]
	x.a = newApplierAfter(x.s, x.cp, job.a)
	return nil
}

// settle waits for the batch in flight.
func (x *EntryApplier) settle() error {
	if x.inflight == nil {
		return nil
	}
	job := x.inflight
	err := <-job.done
	_ = job.a.b.Close()
	x.inflight = nil
	if err == nil {
		x.a.prev = nil
		x.applied.Store(job.a.cp.Applied)
	}
	return err
}

// commitApplier commits a's batch without fsync (the caller syncs the
// store at the end) and publishes its states to the store's cache.
func commitApplier(a *applier) (err error) {
	defer func() {
		// Pebble gives up on a failed WAL write by a fatal log, which
		// panics (see Projector.commit).
		if r := recover(); r != nil {
			sf, ok := r.(storeFatal)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("projector: commit through seq %d: %w", a.cp.Applied, sf)
		}
	}()
	a.seal()
	if err := a.b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("projector: commit through seq %d: %w", a.cp.Applied, err)
	}
	a.committed()
	return nil
}

// ApplyEntries applies entries (which must continue the store's sequence)
// in batches of batch, without NATS, through an EntryApplier; skip entries
// are looked up among the given entries, as the projector looks them up in
// the stream. Benchmarks and tests build views with it.
func ApplyEntries(s *Store, entries []protocol.Entry, batch int) error {
	all := entries
	find := func(seq uint64) (protocol.SkipRecord, bool, error) {
		for _, e := range all {
			if rec, ok := protocol.ParseSkip(e.Seq, e.Subject, e.Headers, e.Data, seq); ok {
				return rec, true, nil
			}
		}
		return protocol.SkipRecord{}, false, nil
	}
	x, err := newEntryApplier(s, batch, find)
	if err != nil {
		return err
	}
	if err := x.Apply(entries...); err != nil {
		_ = x.Close()
		return err
	}
	return x.Close()
}
