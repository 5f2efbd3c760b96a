package projector_test

import (
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
)

func openStore(t *testing.T, dir string) *projector.Store {
	t.Helper()
	s, err := projector.OpenStore(dir, projector.StoreOptions{})
	require.NoError(t, err)
	return s
}

func newProjector(t *testing.T, e *ledgertest.Env, s *projector.Store, batch int) *projector.Projector {
	t.Helper()
	p, err := projector.New(s, e.JS, projector.Config{BatchSize: batch, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	return p
}

func digest(t *testing.T, s *projector.Store) string {
	t.Helper()
	d, err := s.Digest()
	require.NoError(t, err)
	return d
}

func TestDigestIsStableAcrossRebuildRestartAndRuns(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 12)
	ctx := ledgertest.Ctx(t)

	dir := filepath.Join(t.TempDir(), "a")
	s := openStore(t, dir)
	p := newProjector(t, e, s, 7)
	require.NoError(t, p.CatchUp(ctx))
	first := digest(t, s)
	open := openRows(t, s)
	require.Len(t, open, 1, "the scenario's pending call waits")
	applied, err := s.Applied()
	require.NoError(t, err)
	require.NotZero(t, applied)

	require.NoError(t, p.Rebuild(ctx))
	require.Equal(t, first, digest(t, s), "rebuild from sequence 1")
	require.Equal(t, open, openRows(t, s), "rebuild from sequence 1: the same open rows")

	require.NoError(t, s.Close())
	s = openStore(t, dir)
	p = newProjector(t, e, s, 7)
	require.Equal(t, applied, p.Applied(), "checkpoint survives restart")
	require.NoError(t, p.CatchUp(ctx))
	require.Equal(t, first, digest(t, s), "restart")
	require.NoError(t, s.Close())

	other := openStore(t, filepath.Join(t.TempDir(), "b"))
	defer other.Close()
	require.NoError(t, newProjector(t, e, other, 1000).CatchUp(ctx))
	require.Equal(t, first, digest(t, other), "a second run with another batch size")
	require.Equal(t, open, openRows(t, other), "a second run: the same open rows")
}
