package snapshot

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
)

// Snapshots taken while the projector applies and the ledger writes are
// each a consistent set of views: each restores (its digest, sequence and
// chain checked) and catches up to the views of a rebuild.
func TestTakeWhileTheProjectorApplies(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 2)
	s := openViews(t, filepath.Join(t.TempDir(), "views"))
	p, err := projector.New(s, e.JS, projector.Config{BatchSize: 7, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = p.Run(runCtx) })
	writing := make(chan struct{})
	wg.Go(func() {
		defer close(writing)
		e.WriteCalls(t, ctx, 60, 2)
	})
	tg, err := NewDir(filepath.Join(t.TempDir(), "snapshots"))
	require.NoError(t, err)
	var taken []Manifest
	for done := false; !done; {
		select {
		case <-writing:
			done = true
		default:
		}
		m, err := Take(ctx, s, tg, TakeOptions{Stream: ledgerStream})
		require.NoError(t, err)
		taken = append(taken, m)
	}
	stop()
	wg.Wait()
	require.NoError(t, runErr)
	want := rebuiltDigest(t, ctx, e)
	require.GreaterOrEqual(t, len(taken), 2)
	for _, m := range taken {
		// Only m is in the target: Restore must use it, not a newer one.
		one, err := NewDir(filepath.Join(t.TempDir(), "one"))
		require.NoError(t, err)
		r, err := tg.Open(ctx, m.Name)
		require.NoError(t, err)
		require.NoError(t, one.Put(ctx, m, r))
		require.NoError(t, r.Close())
		dir := filepath.Join(t.TempDir(), "views")
		got, err := Restore(ctx, one, dir, restoreOpts(e))
		require.NoError(t, err, m.Name)
		require.Equal(t, m.Name, got.Name)
		restored := openViews(t, dir)
		catchUp(t, ctx, e, restored)
		d, err := restored.Digest()
		require.NoError(t, err)
		require.Equal(t, want, d, "restored from seq %d and caught up", m.AppliedSeq)
	}
}
