package executor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/stream"
)

// TestStartAsksRetryWhileTheClusterHasNoLeader: an executor started while
// its R3 stream has no leader (one node of three up) cannot create its
// consumers; Start asks Config.Retry about each failure instead of giving
// up, and starts once the other nodes are back.
func TestStartAsksRetryWhileTheClusterHasNoLeader(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(t, 0)
	l, err := ledger.Open(ledgertest.Ctx(t), nc, ledger.Config{Streams: stream.Config{Replicas: 3}})
	require.NoError(t, err)
	t.Cleanup(l.Close)

	var mu sync.Mutex
	var steps []string
	ex, err := executor.New(l, nc, executor.Config{Registerer: prometheus.NewRegistry(),
		Retry: func(ctx context.Context, step string, err error) error {
			mu.Lock()
			steps = append(steps, step)
			mu.Unlock()
			t.Logf("retry %s after: %v", step, err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
				return nil
			}
		}})
	require.NoError(t, err)
	require.NoError(t, executor.RegisterBuiltins(ex))
	t.Cleanup(func() { ex.Stop(context.Background()) })

	for i := range c.Size() {
		c.Node(i).Shutdown()
	}
	c.Start(t, 0)
	// Without a deadline, as serve's: each JetStream request then times
	// out on its own (5s) and Start gets to ask Retry.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- ex.Start(ctx) }()
	asked := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(steps)
	}
	require.Eventually(t, func() bool { return asked() > 0 }, time.Minute, 20*time.Millisecond, "Start asks Retry while the stream has no leader")
	select {
	case err := <-done:
		t.Fatalf("Start returned while the stream had no leader: %v", err)
	default:
	}
	c.Start(t, 1)
	c.Start(t, 2)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(2 * time.Minute):
		t.Fatal("Start did not return within two minutes of the cluster coming back")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Regexp(t, `^consumer for (echo|sleep)$`, steps[0], "the step names the consumer")
}
