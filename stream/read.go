package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Read calls fn for every entry of the ledger stream named stream from
// sequence from (1 if 0) to the stream's last sequence when the call
// starts, in order, and returns that last sequence. It is how entries are
// read without a Ledger (the projector, the verifier), and
// ledger.Ledger.ReadEntries reads the ledger's own stream with it. An entry
// from from on that the stream no longer keeps (its retention window let it
// go) is an error wrapping ErrHistoryLost, never a silent jump. A read
// whose consumer delivers nothing for readStallLimit while its next entry
// is still in the stream reads on from that entry with a new consumer; ctx
// bounds the whole read.
func Read(ctx context.Context, js jetstream.JetStream, stream string, from uint64, fn func(protocol.Entry) error) (uint64, error) {
	if from == 0 {
		from = 1
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("read stream %s: %w", stream, err)
	}
	st := s.CachedInfo().State
	last := st.LastSeq
	if last < from {
		return last, nil
	}
	lost := func(next uint64, first uint64) error {
		return fmt.Errorf("%w: entries %d to %d are no longer in stream %s (it keeps %d on)", ErrHistoryLost, next, min(first-1, last), stream, first)
	}
	if st.Msgs == 0 {
		// Every entry expired: an ordered consumer would wait for the next.
		return 0, lost(from, last+1)
	}
	next := from
	for {
		done, err := readSpan(ctx, s, stream, &next, last, fn, lost)
		if err != nil {
			return 0, err
		}
		if done {
			return last, nil
		}
		// The consumer stalled: a new one reads on from next, the first
		// entry fn has not had.
	}
}

// readSpan reads with an ordered consumer of its own from *next, the first
// entry fn has not had, to last, advancing *next past each entry fn takes.
// It returns true once fn has had last, and false when the consumer
// stalled: no entry for readStallLimit though the stream still holds
// *next.
//
// A stall is taken for a lost consumer because the client cannot see
// that loss itself here. In a cluster, the consumer's creation is
// answered over the system account's route, which may overtake the
// subscription its server propagates over the account's own route; the
// first pull request then finds no interest on the client's server and is
// dropped, and the client counts it as pending until it expires. The
// client's own check (a missed heartbeat) only runs within one Next call
// lasting twice the heartbeat (5 s for an ordered consumer), which the
// readStallCheck waits below never do.
func readSpan(ctx context.Context, s jetstream.Stream, stream string, next *uint64, last uint64, fn func(protocol.Entry) error, lost func(next, first uint64) error) (bool, error) {
	// A short inactivity threshold and an explicit delete keep repeated reads
	// (exports, verifications) from piling up consumers against the
	// server's per-stream limit (1000 by default).
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: *next, InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return false, fmt.Errorf("read stream %s: consumer: %w", stream, err)
	}
	defer func() {
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = s.DeleteConsumer(dctx, info.Name)
			cancel()
		}
	}()
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return false, fmt.Errorf("read stream %s: %w", stream, err)
	}
	defer it.Stop()
	// Next takes a timeout (for the stall check below) or a context, not
	// both, and a context with a timeout per entry would cost an
	// allocation and a timer each: a goroutine stops the read on ctx.
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			it.Stop()
		case <-stopped:
		}
	}()
	// The stall limit runs from the consumer's creation, then from each
	// entry delivered.
	progress := time.Now()
	for {
		m, err := it.Next(jetstream.NextMaxWait(readStallCheck))
		if errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			// Nothing arrives: the entries still to read may have expired
			// since the read began.
			info, ierr := s.Info(ctx)
			if ierr != nil {
				return false, fmt.Errorf("read stream %s: %w", stream, ierr)
			}
			if first := info.State.FirstSeq; first > *next || info.State.Msgs == 0 {
				return false, lost(*next, max(first, info.State.LastSeq+1))
			}
			if time.Since(progress) >= readStallLimit {
				return false, nil
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return false, fmt.Errorf("read stream %s: %w", stream, ctx.Err())
			}
			return false, fmt.Errorf("read stream %s: %w", stream, err)
		}
		progress = time.Now()
		meta, err := m.Metadata()
		if err != nil {
			return false, fmt.Errorf("read stream %s: metadata: %w", stream, err)
		}
		e := protocol.Entry{Seq: meta.Sequence.Stream, Subject: m.Subject(), Headers: map[string][]string(m.Headers()), Data: m.Data(), Time: meta.Timestamp.UTC()}
		if e.Seq != *next {
			return false, lost(*next, e.Seq)
		}
		*next++
		if err := fn(e); err != nil {
			return false, err
		}
		if e.Seq >= last {
			return true, nil
		}
	}
}

// readStallCheck is how long a stream read waits for the next entry before
// it checks whether that entry still exists.
const readStallCheck = 2 * time.Second

// readStallLimit is how long a stream read goes without an entry, the next
// one still in the stream, before it takes its consumer for lost and reads
// on with a new one from that entry (readSpan says how one is lost). It is
// twice the ordered consumer's heartbeat, the client's own limit for a
// consumer it hears nothing from; a slow consumer taken for lost costs a
// new consumer, never an entry.
const readStallLimit = 10 * time.Second
