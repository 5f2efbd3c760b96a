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

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/ledger"
)

// Config configures a Projector. Zero values mean the defaults.
type Config struct {
	// Stream is the ledger stream. Empty means ledger.DefaultStream.
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
	// Registerer receives the projector's metrics. Nil keeps them unregistered.
	Registerer prometheus.Registerer
	// Logger receives operational logs. Nil discards them.
	Logger *slog.Logger
}

// Projector applies ledger entries to a Store.
type Projector struct {
	store *Store
	js    jetstream.JetStream
	cfg   Config
	m     *metrics
	log   *slog.Logger

	applied atomic.Uint64

	// afterCommit, when set (tests only), runs after each committed batch; an
	// error stops the projector there, as a crash would.
	afterCommit func(applied uint64) error
}

// New returns a projector writing to store from the ledger stream on js.
func New(store *Store, js jetstream.JetStream, cfg Config) (*Projector, error) {
	if cfg.Stream == "" {
		cfg.Stream = ledger.DefaultStream
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 512
	}
	if cfg.SyncEvery <= 0 {
		cfg.SyncEvery = 16
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

// Fatal reports whether err stops the projector for good (a gap or a
// corrupt entry) rather than a transient failure worth retrying.
func Fatal(err error) bool {
	return errors.Is(err, ErrGap) || errors.Is(err, ErrCorruptEntry)
}

// CatchUp applies entries until the views include the stream's last
// sequence as of the call.
func (p *Projector) CatchUp(ctx context.Context) error {
	s, err := p.js.Stream(ctx, p.cfg.Stream)
	if err != nil {
		return fmt.Errorf("projector: stream %s: %w", p.cfg.Stream, err)
	}
	last := s.CachedInfo().State.LastSeq
	if p.Applied() >= last {
		return nil
	}
	return p.consume(ctx, last)
}

// Run applies entries as they arrive until ctx ends or a gap or corrupt
// entry stops it. Transient NATS failures are retried from the checkpoint.
func (p *Projector) Run(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		err := p.consume(ctx, 0)
		if ctx.Err() != nil {
			return nil
		}
		if Fatal(err) {
			return err
		}
		p.m.errors.WithLabelValues("nats").Inc()
		p.log.Warn("projector: consume failed; retrying from checkpoint", "err", err, "applied", p.Applied())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		if backoff < 2*time.Second {
			backoff *= 2
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
	if first := s.CachedInfo().State.FirstSeq; first > cp.Applied+1 {
		return p.stop(fmt.Errorf("%w: views end at seq %d but the stream starts at %d", ErrGap, cp.Applied, first), "gap")
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: cp.Applied + 1,
	})
	if err != nil {
		return fmt.Errorf("projector: consumer: %w", err)
	}
	// A read-ahead floor keeps tiny batch sizes from starving the client's
	// pull loop (which then waits out a missed heartbeat).
	it, err := cons.Messages(jetstream.PullMaxMessages(max(2*p.cfg.BatchSize, 256)))
	if err != nil {
		return fmt.Errorf("projector: messages: %w", err)
	}
	defer it.Stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			it.Stop()
		case <-done:
		}
	}()

	var pending []ledger.Entry
	batches := 0
	a := newApplier(p.store, cp)
	defer func() { _ = a.b.Close() }()
	for {
		m, err := it.Next()
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
		e := ledger.Entry{Seq: meta.Sequence.Stream, Subject: m.Subject(), Headers: m.Headers(), Data: m.Data(), Time: meta.Timestamp}
		if err := a.apply(e); err != nil {
			reason := "corrupt"
			if errors.Is(err, ErrGap) {
				reason = "gap"
			}
			// Commit the good entries of this batch so the views stop exactly
			// before the bad one.
			if cerr := p.recommit(cp, pending); cerr != nil {
				return errors.Join(err, cerr)
			}
			return p.stop(err, reason)
		}
		pending = append(pending, e)
		if len(pending) >= p.cfg.BatchSize || meta.NumPending == 0 || (until > 0 && e.Seq >= until) {
			batches++
			if err := p.commit(a, meta.NumPending, meta.NumPending == 0 || batches%p.cfg.SyncEvery == 0); err != nil {
				return err
			}
			cp, pending = a.cp, pending[:0]
			_ = a.b.Close()
			a = newApplier(p.store, cp)
			if p.afterCommit != nil {
				if err := p.afterCommit(cp.Applied); err != nil {
					return err
				}
			}
			if until > 0 && cp.Applied >= until {
				return nil
			}
			if until > 0 && meta.NumPending == 0 {
				// Nothing is left in the stream, yet the sequences up to
				// until were there when CatchUp began: they are missing.
				return p.stop(fmt.Errorf("%w: sequence %d is missing (the stream ends at %d)", ErrGap, cp.Applied+1, cp.Applied), "gap")
			}
		}
	}
}

func (p *Projector) commit(a *applier, lag uint64, sync bool) error {
	n := a.cp.Applied - p.Applied()
	start := time.Now()
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	if err := a.b.Commit(opts); err != nil {
		p.m.errors.WithLabelValues("store").Inc()
		return fmt.Errorf("projector: commit through seq %d: %w", a.cp.Applied, err)
	}
	a.committed()
	p.m.commit.Observe(time.Since(start).Seconds())
	p.applied.Store(a.cp.Applied)
	p.m.applied.Add(float64(n))
	p.m.appliedTo.Set(float64(a.cp.Applied))
	p.m.lag.Set(float64(lag))
	return nil
}

// recommit re-applies the good entries of a failed batch in a fresh batch.
func (p *Projector) recommit(cp checkpoint, good []ledger.Entry) error {
	if len(good) == 0 {
		return nil
	}
	a := newApplier(p.store, cp)
	defer func() { _ = a.b.Close() }()
	for _, e := range good {
		if err := a.apply(e); err != nil {
			return fmt.Errorf("projector: re-apply seq %d: %w", e.Seq, err)
		}
	}
	return p.commit(a, 0, true)
}

func (p *Projector) stop(err error, reason string) error {
	p.m.errors.WithLabelValues(reason).Inc()
	p.m.stalled.Set(1)
	p.log.Error("projector stopped; it will not skip the entry", "err", err, "applied", p.Applied())
	return err
}
