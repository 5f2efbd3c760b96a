package stream_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// TestReadResumesWhenItsConsumerIsLost: a read whose consumer disappears
// while no pull request of the client is waiting on it (as when the
// client's first pull request is dropped in a cluster) hears nothing of
// the loss: its next pull request goes nowhere. The read must read on from
// the first entry it has not delivered, with a new consumer, and deliver
// every entry once, in order.
func TestReadResumesWhenItsConsumerIsLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	require.NoError(t, stream.Provision(ctx, js, stream.Config{}))
	// More entries than the read's first pull request (1024) asks for, so
	// that it must pull again after the loss.
	const entries = 1100
	for i := range entries {
		_, err := js.PublishAsync(protocol.CardSubject("v1", "proj", fmt.Sprintf("card-%d", i)), []byte(`{}`))
		require.NoError(t, err)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("the entries were not all stored")
	}
	s, err := js.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)

	var seqs []uint64
	deleted := ""
	last, err := stream.Read(ctx, js, stream.DefaultName, 0, func(e protocol.Entry) error {
		seqs = append(seqs, e.Seq)
		if deleted != "" {
			return nil
		}
		// The first pull request is answered in full (no request waits
		// on the consumer), then the consumer goes.
		var name string
		require.Eventually(t, func() bool {
			names := s.ConsumerNames(ctx)
			for n := range names.Name() {
				name = n
			}
			if name == "" {
				return false
			}
			ci, err := s.Consumer(ctx, name)
			if err != nil {
				return false
			}
			info := ci.CachedInfo()
			return info.Delivered.Stream == 1024 && info.NumWaiting == 0
		}, time.Minute, 10*time.Millisecond)
		require.NoError(t, s.DeleteConsumer(ctx, name))
		deleted = name
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, deleted)
	require.Equal(t, uint64(entries), last)
	require.Len(t, seqs, entries, "every entry once")
	for i, seq := range seqs {
		require.Equal(t, uint64(i+1), seq, "in order")
	}
	names := s.ConsumerNames(ctx)
	var left []string
	for n := range names.Name() {
		left = append(left, n)
	}
	require.Empty(t, left, "the read deletes the consumer it read on with")
}
