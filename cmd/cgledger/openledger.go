package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cgledger/cgledger/internal/backoff"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/ledger"
)

// Serve's start-up policy towards JetStream: a step that fails because the
// cluster cannot answer yet (clusterSettling: peers starting, a meta or
// stream leader being elected, so requests time out) is tried again after a
// delay doubling from startRetryFirst to startRetryMax, logged each time,
// until it succeeds, fails for another reason, or serve is stopped. There is
// no deadline of its own: a supervisor restarting a serve that gave up would
// only start the same wait again (docs/durability.md, "Running serve on a
// cluster").
const (
	startRetryFirst = 250 * time.Millisecond
	startRetryMax   = 5 * time.Second
)

// untilClusterAnswers runs one start-up step under serve's start-up policy.
// step names it in the log and in the error.
func untilClusterAnswers(ctx context.Context, log *slog.Logger, step string, f func() error) error {
	retry := startRetry(log, ctx)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if rerr := retry(ctx, step, err); rerr != nil {
			return rerr
		}
	}
}

// startRetry returns the start-up policy as a hook for parts that run their
// own steps (the executor's Config.Retry): it waits and returns nil when err
// is the cluster not answering yet, and returns an error to give up with
// otherwise. Each step has its own growing delay. The parts run on a
// context that outlives a signal (they are stopped in order at shutdown),
// so the wait also ends when stop does: a signal during start-up stops
// serve rather than waiting for the cluster.
func startRetry(log *slog.Logger, stop context.Context) func(ctx context.Context, step string, err error) error {
	var mu sync.Mutex
	waits := map[string]*backoff.Doubling{}
	return func(ctx context.Context, step string, err error) error {
		if stop.Err() != nil {
			return fmt.Errorf("%w (stopped while waiting for the cluster after: %w)", context.Cause(stop), err)
		}
		if ctx.Err() != nil || !clusterSettling(err) {
			return err
		}
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		unwatch := context.AfterFunc(stop, func() { cancel(context.Cause(stop)) })
		defer unwatch()
		mu.Lock()
		defer mu.Unlock()
		wait := waits[step]
		if wait == nil {
			wait = backoff.New(startRetryFirst, startRetryMax)
			waits[step] = wait
		}
		log.Warn("the NATS cluster does not answer yet (peers starting, or a leader being elected); serve waits and retries", "step", step, "err", err, "retry_in", wait.Next())
		if werr := wait.Wait(ctx); werr != nil {
			if cause := context.Cause(ctx); cause != nil {
				werr = cause
			}
			return fmt.Errorf("%w (while waiting for the cluster after: %w)", werr, err)
		}
		return nil
	}
}

// openLedger opens the ledger under serve's start-up policy: while a
// cluster cannot place or reach its streams yet it waits and tries again.
func openLedger(ctx context.Context, nc *nats.Conn, cfg ledger.Config, log *slog.Logger) (*ledger.Ledger, error) {
	var l *ledger.Ledger
	err := untilClusterAnswers(ctx, log, "open ledger", func() (err error) {
		l, err = ledger.Open(ctx, nc, cfg)
		return err
	})
	return l, err
}

// clusterSettling reports errors a cluster gives while it is still forming
// or electing a leader: JetStream requests that nobody answers in time.
func clusterSettling(err error) bool {
	msg := err.Error()
	for _, s := range []string{"no suitable peers", "temporarily unavailable", "peer offline", "no responders", "context deadline exceeded", "i/o timeout", "nats: timeout"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
