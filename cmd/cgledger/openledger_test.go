package main

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestStartRetryEndsWhenServeIsStopped: the executor and the deadline keeper
// wait for the cluster on a context that outlives the signal (they are
// stopped in order at shutdown), so the start-up policy must also end its
// wait when serve's own context ends: a SIGTERM during start-up stops serve
// instead of leaving it waiting for the cluster (found from outside: a serve
// waiting at "consumer for echo" ignored SIGTERM for 70 s).
func TestStartRetryEndsWhenServeIsStopped(t *testing.T) {
	stop, signal := context.WithCancel(context.Background())
	retry := startRetry(slog.New(slog.DiscardHandler), stop)
	life := context.Background() // never ends by itself, as serve's parts' context
	settling := errors.New("consumer for echo: " + nats.ErrTimeout.Error())

	// While serve runs, the cluster not answering is waited for.
	require.NoError(t, retry(life, "consumer for echo", settling))

	done := make(chan error, 1)
	go func() {
		// The delays grow to startRetryMax; keep asking until stopped.
		for {
			if err := retry(life, "consumer for echo", settling); err != nil {
				done <- err
				return
			}
		}
	}()
	signal()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(time.Minute):
		t.Fatal("the start-up wait did not end when serve was stopped")
	}
	// Stopped: no more waiting, whatever the error.
	require.ErrorIs(t, retry(life, "consumer for echo", settling), context.Canceled)
}
