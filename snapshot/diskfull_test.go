package snapshot

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/testenv"
	"github.com/cgledger/cgledger/ledger/ledgertest"
)

// A disk too small for the unpack is the host's failure, not the
// snapshots': Restore stops at the first one with the disk's error instead
// of refusing each in turn, and once the disk has room it restores the
// newest.
func TestRestoreOnAFullDiskStopsWithoutRefusingTheSnapshots(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 12)
	live := builtViews(t, ctx, e)
	tg, err := NewDir(filepath.Join(t.TempDir(), "snaps"))
	require.NoError(t, err)
	_, err = Take(ctx, live, tg, TakeOptions{Stream: ledgerStream, TempDir: t.TempDir()})
	require.NoError(t, err)
	e.WriteCalls(t, ctx, 6, 2)
	catchUp(t, ctx, e, live)
	newest, err := Take(ctx, live, tg, TakeOptions{Stream: ledgerStream, TempDir: t.TempDir()})
	require.NoError(t, err)

	small := testenv.MountTmpfs(t, int(newest.Size/2048))
	var logs bytes.Buffer
	opts := restoreOpts(e)
	opts.Log = slog.New(slog.NewTextHandler(&logs, nil))
	opts.TempDir = small
	views := filepath.Join(small, "views")
	_, err = Restore(ctx, tg, views, opts)
	require.ErrorIs(t, err, syscall.ENOSPC)
	var refused *RefusedError
	require.False(t, errors.As(err, &refused), "a full disk refuses no snapshot: %v", err)
	require.NotErrorIs(t, err, ErrNoSnapshot)
	require.NotContains(t, logs.String(), "refused", "no snapshot is logged as refused")
	require.Contains(t, err.Error(), newest.Name, "it stopped at the newest")

	testenv.ResizeTmpfs(t, small, int(4*newest.Size/1024)+1024)
	got, err := Restore(ctx, tg, views, opts)
	require.NoError(t, err)
	require.Equal(t, newest.Name, got.Name)
	d, err := openViews(t, views).Digest()
	require.NoError(t, err)
	require.Equal(t, newest.Digest, d)
}
