package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// keeper runs the durable consumer of a serve-side keeper (the deadline
// keeper, the approval keeper): it creates the consumer, handles up to
// workers deliveries at once, and on stop lets the handlers running finish
// while the deliveries waiting for a worker go back to the server (those
// still in the client's buffer come back after the consumer's AckWait). The keepers
// own what a delivery means; this owns only how deliveries are run.
type keeper struct {
	name    string // "deadline keeper": prefixes its errors and logs
	log     *slog.Logger
	process func(jetstream.Msg)

	cc jetstream.ConsumeContext
	// ctx is the handlers' context: detached from the start's context so
	// that a serve's shutdown does not cut a handler half-way; canceled
	// by stop once the handlers are done or its deadline has passed.
	ctx    context.Context
	cancel context.CancelFunc
	sem    chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	// mu orders handle's wg.Add before stop's wg.Wait: the consumer's
	// callback may still be running when stop is called, and an Add on a
	// zero counter concurrent with Wait is a misuse of the WaitGroup.
	mu      sync.Mutex
	stopped bool
}

// keeperSpec is what a keeper needs to start.
type keeperSpec struct {
	name    string
	log     *slog.Logger
	workers int
	// create creates (or binds) the consumer.
	create func(ctx context.Context) (jetstream.Consumer, error)
	// retry, when set, is asked after create fails: nil to try again, an
	// error to give up with it. Nil gives up at once.
	retry   func(ctx context.Context, step string, err error) error
	process func(jetstream.Msg)
}

// start creates the consumer (asking spec.retry after each failure) and
// starts consuming with spec.process.
func (k *keeper) start(ctx context.Context, spec keeperSpec) error {
	var cons jetstream.Consumer
	for {
		var err error
		if cons, err = spec.create(ctx); err == nil {
			break
		}
		if spec.retry == nil {
			return err
		}
		if rerr := spec.retry(ctx, spec.name+" consumer", err); rerr != nil {
			return rerr
		}
	}
	k.name, k.log, k.process = spec.name, spec.log, spec.process
	k.ctx, k.cancel = context.WithCancel(context.WithoutCancel(ctx))
	k.sem = make(chan struct{}, spec.workers)
	cc, err := cons.Consume(k.handle, jetstream.PullMaxMessages(4*spec.workers))
	if err != nil {
		k.cancel()
		return fmt.Errorf("%s: consume: %w", k.name, err)
	}
	k.cc = cc
	return nil
}

// stop stops taking deliveries and waits (up to ctx) for those being
// handled. Deliveries taken and not handled come back to another process
// (or this one, started again) after the consumer's AckWait.
func (k *keeper) stop(ctx context.Context) error {
	k.once.Do(func() { k.cc.Stop() })
	k.mu.Lock()
	k.stopped = true
	k.mu.Unlock()
	done := make(chan struct{})
	go func() {
		k.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		k.cancel()
		return nil
	case <-ctx.Done():
		k.cancel()
		<-done
		return fmt.Errorf("%s: stop: %w", k.name, ctx.Err())
	}
}

// handle is the consumer's callback: it waits for a free worker, so the
// server holds back deliveries beyond PullMaxMessages while all are busy.
func (k *keeper) handle(msg jetstream.Msg) {
	select {
	case k.sem <- struct{}{}:
	case <-k.ctx.Done():
		_ = msg.Nak()
		return
	}
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		<-k.sem
		_ = msg.Nak()
		return
	}
	k.wg.Add(1)
	k.mu.Unlock()
	go func() {
		defer k.wg.Done()
		defer func() { <-k.sem }()
		k.process(msg)
	}()
}

// later hands a delivery back after a transient failure: at once to the
// next process when this one is stopping, else after a second.
func (k *keeper) later(msg jetstream.Msg, what string, err error) {
	k.log.Warn(k.name+": will retry", "step", what, "subject", msg.Subject(), "err", err)
	if k.ctx.Err() != nil {
		_ = msg.Nak()
		return
	}
	_ = msg.NakWithDelay(time.Second)
}

// keeperConsumer creates (or updates) a keeper's durable consumer of the
// ledger stream (cfg: its name, description, filters and AckWait), taking
// every entry from the start with explicit acks. An entry stays pending
// until its keeper is done with it, which may be days away: no cap on
// pending entries or deliveries, or a burst of long waits would hold back
// the short ones behind it. The server keeps one pending entry per such
// call (docs/decisions.md).
func (l *Ledger) keeperConsumer(name string, cfg jetstream.ConsumerConfig) func(ctx context.Context) (jetstream.Consumer, error) {
	cfg.AckPolicy = jetstream.AckExplicitPolicy
	cfg.MaxAckPending, cfg.MaxDeliver = -1, -1
	cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	return func(ctx context.Context) (jetstream.Consumer, error) {
		cons, err := l.js.CreateOrUpdateConsumer(ctx, l.streams.Stream, cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: consumer %s: %w", name, cfg.Durable, err)
		}
		return cons, nil
	}
}
