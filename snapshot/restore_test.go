package snapshot

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
)

// A restored snapshot caught up from its sequence is the same views as a
// rebuild from sequence 1, and the chain verifies against the stream.
func TestRestoreThenCatchUpEqualsRebuild(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 12)
	live := builtViews(t, ctx, e)
	for kind, tg := range targets(t, ctx, e, "snaps_rebuild") {
		t.Run(kind, func(t *testing.T) {
			m, err := Take(ctx, live, tg, TakeOptions{Stream: ledgerStream, Host: "h1", TempDir: t.TempDir()})
			require.NoError(t, err)
			applied, err := live.Applied()
			require.NoError(t, err)
			require.Equal(t, applied, m.AppliedSeq)
			require.NotEmpty(t, m.Files)
			listed, err := tg.List(ctx)
			require.NoError(t, err)
			require.Equal(t, []string{m.Name}, names(listed))
			require.True(t, sameManifest(m, listed[0]), "the listed manifest is the one taken")

			// The ledger goes on after the snapshot.
			e.WriteCalls(t, ctx, 6, 2)

			dir := filepath.Join(t.TempDir(), "restored")
			got, err := Restore(ctx, tg, dir, restoreOpts(e))
			require.NoError(t, err)
			require.Equal(t, m.Name, got.Name)
			s := openViews(t, dir)
			d, err := s.Digest()
			require.NoError(t, err)
			require.Equal(t, m.Digest, d, "the restored views are the snapshot's")
			catchUp(t, ctx, e, s)
			d, err = s.Digest()
			require.NoError(t, err)
			require.Equal(t, rebuiltDigest(t, ctx, e), d, "restore + catch-up = rebuild from seq 1")
			rep, err := s.VerifyStream(ctx, e.JS, ledgerStream)
			require.NoError(t, err)
			require.True(t, rep.OK, "verify: %+v", rep)
		})
	}
}

// Two replicas restoring the same snapshot at once both get whole views,
// the same ones.
func TestTwoRestoresOfOneSnapshotAtOnce(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 8)
	live := builtViews(t, ctx, e)
	for kind, tg := range targets(t, ctx, e, "snaps_twice") {
		t.Run(kind, func(t *testing.T) {
			m, err := Take(ctx, live, tg, TakeOptions{Stream: ledgerStream})
			require.NoError(t, err)
			base := t.TempDir()
			dirs := []string{filepath.Join(base, "a", "views"), filepath.Join(base, "b", "views")}
			errs := make([]error, len(dirs))
			var wg sync.WaitGroup
			for i, dir := range dirs {
				wg.Go(func() {
					_, errs[i] = Restore(ctx, tg, dir, restoreOpts(e))
				})
			}
			wg.Wait()
			for i, dir := range dirs {
				require.NoError(t, errs[i])
				d, err := openViews(t, dir).Digest()
				require.NoError(t, err)
				require.Equal(t, m.Digest, d, dir)
			}
		})
	}
}

// Restore installs into a missing or empty directory and leaves a
// non-empty one as it is.
func TestRestoreOnlyIntoAnEmptyDirectory(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 2)
	tg, err := NewDir(filepath.Join(t.TempDir(), "snapshots"))
	require.NoError(t, err)
	m, err := Take(ctx, builtViews(t, ctx, e), tg, TakeOptions{Stream: ledgerStream})
	require.NoError(t, err)

	empty := filepath.Join(t.TempDir(), "views")
	require.NoError(t, os.Mkdir(empty, 0o755))
	got, err := Restore(ctx, tg, empty, restoreOpts(e))
	require.NoError(t, err)
	require.Equal(t, m.Name, got.Name)
	d, err := openViews(t, empty).Digest()
	require.NoError(t, err)
	require.Equal(t, m.Digest, d)

	full := filepath.Join(t.TempDir(), "views")
	require.NoError(t, os.Mkdir(full, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(full, "old"), []byte("old views"), 0o644))
	_, err = Restore(ctx, tg, full, restoreOpts(e))
	require.ErrorContains(t, err, "is not empty")
	require.NotErrorIs(t, err, ErrNoSnapshot)
	ents, err := os.ReadDir(full)
	require.NoError(t, err)
	require.Len(t, ents, 1, "the old views are left as they are")

	_, err = Restore(ctx, tg, filepath.Join(t.TempDir(), "views"), RestoreOptions{Stream: ledgerStream})
	require.Error(t, err, "a JetStream context is required")
	_, err = Restore(ctx, tg, filepath.Join(t.TempDir(), "views"), RestoreOptions{Stream: "OTHER", JS: e.JS, Log: restoreOpts(e).Log})
	var refused *RefusedError
	require.ErrorAs(t, err, &refused)
	require.Contains(t, refused.Refused[0].Reason, `taken from stream "CG_LEDGER", not "OTHER"`)
}
