package snapshot

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/stream"
)

// ledgerStream is the stream every test ledger writes (the default).
const ledgerStream = stream.DefaultName

// openViews opens (creating) a views store in dir, closed with the test.
func openViews(t *testing.T, dir string) *projector.Store {
	t.Helper()
	s, err := projector.OpenStore(dir, projector.StoreOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// catchUp applies the whole stream of e to s.
func catchUp(t *testing.T, ctx context.Context, e *ledgertest.Env, s *projector.Store) {
	t.Helper()
	p, err := projector.New(s, e.JS, projector.Config{BatchSize: 256, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, p.CatchUp(ctx))
}

// builtViews is a store in a new directory holding e's whole stream.
func builtViews(t *testing.T, ctx context.Context, e *ledgertest.Env) *projector.Store {
	t.Helper()
	s := openViews(t, filepath.Join(t.TempDir(), "views"))
	catchUp(t, ctx, e, s)
	return s
}

// rebuiltDigest is the digest of views rebuilt from sequence 1 of e's stream.
func rebuiltDigest(t *testing.T, ctx context.Context, e *ledgertest.Env) string {
	t.Helper()
	d, err := builtViews(t, ctx, e).Digest()
	require.NoError(t, err)
	return d
}

// targets are both kinds of target, fresh, on e's server.
func targets(t *testing.T, ctx context.Context, e *ledgertest.Env, bucket string) map[string]Target {
	t.Helper()
	d, err := NewDir(filepath.Join(t.TempDir(), "snapshots"))
	require.NoError(t, err)
	o, err := NewObjectStore(ctx, e.JS, bucket, 1)
	require.NoError(t, err)
	return map[string]Target{"dir": d, "objectstore": o}
}

// restoreOpts are the options of a restore against e's stream.
func restoreOpts(e *ledgertest.Env) RestoreOptions {
	return RestoreOptions{Stream: ledgerStream, JS: e.JS, Log: slog.New(slog.DiscardHandler)}
}

func names(ms []Manifest) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}
