package projector_test

import (
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
)

// TestLagIsReadAtScrapeTime: a projector that has applied nothing shows the
// whole stream as lag, in entries and in seconds, without any commit; once
// caught up both are 0.
func TestLagIsReadAtScrapeTime(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	reg := prometheus.NewRegistry()
	p, err := projector.New(s, e.JS, projector.Config{Registerer: reg})
	require.NoError(t, err)
	st, err := e.JS.Stream(ctx, e.L.StreamName())
	require.NoError(t, err)
	last := st.CachedInfo().State.LastSeq
	require.NotZero(t, last)

	entries, ok := metricValue(t, reg, "cgledger_projector_lag_entries")
	require.True(t, ok)
	require.Equal(t, float64(last), entries)
	seconds, ok := metricValue(t, reg, "cgledger_projector_lag_seconds")
	require.True(t, ok)
	require.Greater(t, seconds, 0.0, "the oldest unapplied entry has an age")

	require.NoError(t, p.CatchUp(ctx))
	requireMetric(t, reg, 0, "cgledger_projector_lag_entries")
	requireMetric(t, reg, 0, "cgledger_projector_lag_seconds")
}
