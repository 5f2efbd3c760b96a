package ledger

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
)

// TestKeeperStopHandsBackWaitingDeliveries: a delivery whose handler is
// waiting for a worker when the keeper stops is handed back, not handled
// after (or racing) stop's wait; another process then gets it and those
// the client had buffered (after their AckWait), so nothing is lost.
func TestKeeperStopHandsBackWaitingDeliveries(t *testing.T) {
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEPER", Subjects: []string{"keeper.>"}})
	require.NoError(t, err)
	create := func(ctx context.Context) (jetstream.Consumer, error) {
		return stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: "k", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: -1,
		})
	}
	for _, s := range []string{"keeper.a", "keeper.b", "keeper.c"} {
		_, err := js.Publish(ctx, s, []byte(s))
		require.NoError(t, err)
	}

	var mu sync.Mutex
	handled := map[string]int{} // by subject
	byKeeper := map[string]int{}
	gate := make(chan struct{})
	first := true
	processBy := func(name string) func(jetstream.Msg) {
		return func(msg jetstream.Msg) {
			mu.Lock()
			handled[msg.Subject()]++
			byKeeper[name]++
			wait := first
			first = false
			mu.Unlock()
			if wait {
				<-gate
			}
			_ = msg.Ack()
		}
	}
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return byKeeper[name]
	}
	spec := keeperSpec{name: "test keeper", log: slog.New(slog.DiscardHandler), workers: 1, create: create}

	var k keeper
	spec.process = processBy("first")
	require.NoError(t, k.start(ctx, spec))
	// One delivery holds the only worker; the others reach the client,
	// and the next waits in handle for the worker.
	require.Eventually(t, func() bool { return count("first") == 1 }, time.Minute, 10*time.Millisecond)
	cons, err := create(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 3
	}, time.Minute, 10*time.Millisecond)

	stopped := make(chan error, 1)
	go func() { stopped <- k.stop(ctx) }()
	require.Eventually(t, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.stopped
	}, time.Minute, time.Millisecond)
	close(gate)
	require.NoError(t, <-stopped)

	var k2 keeper
	spec.process = processBy("second")
	require.NoError(t, k2.start(ctx, spec))
	defer func() { require.NoError(t, k2.stop(ctx)) }()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 3
	}, time.Minute, 10*time.Millisecond, "the deliveries handed back reach the next keeper")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, byKeeper["first"], "a delivery waiting for a worker when the keeper stopped was handled by it")
	require.Equal(t, 2, byKeeper["second"])
}
