package httpapi_test

import (
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
)

// The views the audit API's tests read (copies of projector's test helpers).

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

// scenarioViews builds the standard scenario and projects it.
func scenarioViews(t *testing.T) (*ledgertest.Env, *projector.Store, *projector.Queries) {
	t.Helper()
	e := ledgertest.New(t)
	e.Scenario(t, 12)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, newProjector(t, e, s, 16).CatchUp(ledgertest.Ctx(t)))
	return e, s, projector.NewQueries(s)
}
