package stream_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/stream"
)

func TestProvisionIsIdempotent(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxT(t)
	cfg := stream.Config{DuplicateWindow: time.Minute, MaxMsgSize: 512 << 10}
	require.NoError(t, stream.Provision(ctx, js, cfg))
	before, err := js.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	require.NoError(t, stream.Provision(ctx, js, cfg))
	after, err := js.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	require.Equal(t, before.CachedInfo().Config, after.CachedInfo().Config)
	require.Equal(t, before.CachedInfo().Created, after.CachedInfo().Created)

	c := after.CachedInfo().Config
	require.Equal(t, jetstream.FileStorage, c.Storage)
	require.Equal(t, 1, c.Replicas)
	require.Equal(t, time.Minute, c.Duplicates)
	require.EqualValues(t, 512<<10, c.MaxMsgSize)
	require.True(t, c.DenyDelete)
	require.True(t, c.DenyPurge)
	require.Equal(t, jetstream.DiscardNew, c.Discard)

	kv, err := js.Stream(ctx, "KV_"+stream.DefaultBucket)
	require.NoError(t, err)
	require.Equal(t, jetstream.FileStorage, kv.CachedInfo().Config.Storage)
}

func TestProvisionRefusesIncompatibleExistingStream(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxT(t)
	require.NoError(t, stream.Provision(ctx, js, stream.Config{}))
	existing, err := js.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)

	err = stream.Provision(ctx, js, stream.Config{DuplicateWindow: 5 * time.Minute, MaxMsgSize: 2 << 20})
	require.ErrorIs(t, err, stream.ErrIncompatibleConfig)
	var ice *stream.IncompatibleConfigError
	require.ErrorAs(t, err, &ice)
	require.Len(t, ice.Diffs, 2, "%v", ice.Diffs)
	require.Contains(t, ice.Diffs[0], "duplicate_window")
	require.Contains(t, ice.Diffs[1], "max_msg_size")

	unchanged, err := js.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	require.Equal(t, existing.CachedInfo().Config, unchanged.CachedInfo().Config, "nothing changed")

	// Open refuses too.
	_, err = ledger.Open(ctx, nc, ledger.Config{Streams: stream.Config{MaxMsgSize: 2 << 20}})
	require.ErrorIs(t, err, stream.ErrIncompatibleConfig)
}

// ctxT is a context that ends with the test.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestProvisionTurnsOnAtomicPublishInPlace: a ledger stream created before
// report.result (no atomic batch publish) is updated in place on start,
// keeping what it holds and every other setting.
func TestProvisionTurnsOnAtomicPublishInPlace(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxT(t)
	require.NoError(t, stream.Provision(ctx, js, stream.Config{}))
	s, err := js.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	old := s.CachedInfo().Config
	require.True(t, old.AllowAtomicPublish)
	old.AllowAtomicPublish = false
	_, err = js.UpdateStream(ctx, old)
	require.NoError(t, err)
	_, err = js.Publish(ctx, "cg.v1.p.card.c1", []byte(`{}`))
	require.NoError(t, err)

	require.NoError(t, stream.Provision(ctx, js, stream.Config{}))
	s, err = js.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	got := s.CachedInfo()
	require.True(t, got.Config.AllowAtomicPublish)
	got.Config.AllowAtomicPublish = false
	require.Equal(t, old, got.Config, "no other setting changed")
	require.EqualValues(t, 1, got.State.Msgs, "what it holds is kept")
}
