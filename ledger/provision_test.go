package ledger_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

func TestProvisionIsIdempotent(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxT(t)
	cfg := ledger.StreamConfig{DuplicateWindow: time.Minute, MaxMsgSize: 512 << 10}
	require.NoError(t, ledger.Provision(ctx, js, cfg))
	before, err := js.Stream(ctx, ledger.DefaultStream)
	require.NoError(t, err)
	require.NoError(t, ledger.Provision(ctx, js, cfg))
	after, err := js.Stream(ctx, ledger.DefaultStream)
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

	kv, err := js.Stream(ctx, "KV_"+ledger.DefaultBucket)
	require.NoError(t, err)
	require.Equal(t, jetstream.FileStorage, kv.CachedInfo().Config.Storage)
}

func TestProvisionRefusesIncompatibleExistingStream(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxT(t)
	require.NoError(t, ledger.Provision(ctx, js, ledger.StreamConfig{}))
	existing, err := js.Stream(ctx, ledger.DefaultStream)
	require.NoError(t, err)

	err = ledger.Provision(ctx, js, ledger.StreamConfig{DuplicateWindow: 5 * time.Minute, MaxMsgSize: 2 << 20})
	require.ErrorIs(t, err, ledger.ErrIncompatibleConfig)
	var ice *ledger.IncompatibleConfigError
	require.ErrorAs(t, err, &ice)
	require.Len(t, ice.Diffs, 2, "%v", ice.Diffs)
	require.Contains(t, ice.Diffs[0], "duplicate_window")
	require.Contains(t, ice.Diffs[1], "max_msg_size")

	unchanged, err := js.Stream(ctx, ledger.DefaultStream)
	require.NoError(t, err)
	require.Equal(t, existing.CachedInfo().Config, unchanged.CachedInfo().Config, "nothing changed")

	// Open refuses too.
	_, err = ledger.Open(ctx, nc, ledger.Config{Streams: ledger.StreamConfig{MaxMsgSize: 2 << 20}})
	require.ErrorIs(t, err, ledger.ErrIncompatibleConfig)
}

func TestLedgerSurvivesRestartOnSameStore(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-r", "call-r", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	e.srv.Restart(t)
	waitConnected(t, e.nc)
	// Re-open as a restarted process would: provisioning finds everything in place.
	l2, err := ledger.Open(ctx, e.nc, ledger.Config{})
	require.NoError(t, err)
	card, err := l2.GetCard(ctx, project, rc.CardID)
	require.NoError(t, err)
	require.Equal(t, rc.CardID, card.Card.CardID)
	dup, err := l2.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, out.Seq, dup.Seq)
}
