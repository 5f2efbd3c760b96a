package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cgledger/cgledger/internal/backoff"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/ledger"
)

// openLedger opens the ledger, waiting (up to two minutes, logging each
// try) while a cluster cannot place its streams yet: peers that have just
// started, or a meta leader being elected. Any other error is returned at
// once.
func openLedger(ctx context.Context, nc *nats.Conn, cfg ledger.Config, log *slog.Logger) (*ledger.Ledger, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for wait := backoff.New(250*time.Millisecond, 5*time.Second); ; {
		l, err := ledger.Open(ctx, nc, cfg)
		if err == nil || !clusterSettling(err) || time.Now().After(deadline) {
			return l, err
		}
		log.Warn("the cluster cannot place the ledger's streams yet; retrying", "err", err, "retry_in", wait.Next())
		if werr := wait.Wait(ctx); werr != nil {
			return nil, fmt.Errorf("open ledger: %w (last: %v)", werr, err)
		}
	}
}

// clusterSettling reports errors a cluster gives while it is still forming.
func clusterSettling(err error) bool {
	msg := err.Error()
	for _, s := range []string{"no suitable peers", "temporarily unavailable", "peer offline", "no responders", "context deadline exceeded", "i/o timeout"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
