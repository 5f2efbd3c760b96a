package snapshot

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
)

// BenchmarkRestoreAgainstRebuild measures, in the same run, a fresh
// replica's time to views of the whole ledger by a rebuild from sequence 1
// and by a restore (every check) of a snapshot of them from each target
// then a catch-up, and reports each restore as a ratio of the rebuild.
// CGLEDGER_SNAPSHOT_BENCH_CALLS sets the number of calls (3000).
func BenchmarkRestoreAgainstRebuild(b *testing.B) {
	e := ledgertest.New(b)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	calls := 3000
	if v := os.Getenv("CGLEDGER_SNAPSHOT_BENCH_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err)
		calls = n
	}
	e.WriteCalls(b, ctx, calls, 4)
	src := openViewsB(b, filepath.Join(b.TempDir(), "views"))
	p, err := projector.New(src, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(b, err)
	require.NoError(b, p.CatchUp(ctx))
	d, err := NewDir(filepath.Join(b.TempDir(), "snapshots"))
	require.NoError(b, err)
	o, err := NewObjectStore(ctx, e.JS, "snaps_bench", 1)
	require.NoError(b, err)
	tgs := []Target{d, o}
	for _, tg := range tgs {
		_, err := Take(ctx, src, tg, TakeOptions{Stream: ledgerStream})
		require.NoError(b, err)
	}
	require.NoError(b, src.Close())
	var rebuild time.Duration
	restore := make([]time.Duration, len(tgs))
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		s := openViewsB(b, filepath.Join(b.TempDir(), "views"))
		catchUpB(b, e, s)
		rebuild += time.Since(start)
		closeB(b, s)
		for i, tg := range tgs {
			start := time.Now()
			dir := filepath.Join(b.TempDir(), "views")
			_, err := Restore(ctx, tg, dir, restoreOpts(e))
			require.NoError(b, err)
			s := openViewsB(b, dir)
			catchUpB(b, e, s)
			restore[i] += time.Since(start)
			closeB(b, s)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(rebuild.Milliseconds())/float64(b.N), "rebuild-ms")
	b.ReportMetric(float64(restore[0])/float64(rebuild), "dir-x-rebuild")
	b.ReportMetric(float64(restore[1])/float64(rebuild), "objstore-x-rebuild")
}

func openViewsB(b *testing.B, dir string) *projector.Store {
	s, err := projector.OpenStore(dir, projector.StoreOptions{})
	require.NoError(b, err)
	return s
}

func catchUpB(b *testing.B, e *ledgertest.Env, s *projector.Store) {
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(b, err)
	require.NoError(b, p.CatchUp(ledgertest.Ctx(b)))
}

// closeB closes s outside the measured time (Close waits for running
// compactions) and before the next measurement (they must not run into it).
func closeB(b *testing.B, s *projector.Store) {
	b.StopTimer()
	require.NoError(b, s.Close())
	b.StartTimer()
}
