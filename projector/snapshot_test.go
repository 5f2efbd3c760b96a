package projector_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
)

// A checkpoint holds the views as they were: opened read-only it has the
// live store's digest, sequence, head, format and links, and it is not
// written to.
func TestCheckpointIsTheViewsReadOnly(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 6)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	require.NoError(t, newProjector(t, e, s, 5).CatchUp(ctx))
	live, err := s.DigestNow()
	require.NoError(t, err)

	dir := filepath.Join(t.TempDir(), "cp")
	res, err := s.Checkpoint(dir)
	require.NoError(t, err)
	require.Equal(t, live, res)
	_, err = s.Checkpoint(dir)
	require.Error(t, err, "a checkpoint never overwrites a directory")

	cp, err := projector.OpenCheckpoint(dir)
	require.NoError(t, err)
	again, err := cp.DigestNow()
	require.NoError(t, err)
	require.Equal(t, live, again)
	format, err := cp.Format()
	require.NoError(t, err)
	require.Equal(t, projector.ViewsFormat, format)
	want, ok, err := s.LinkAt(live.AppliedSeq)
	require.NoError(t, err)
	require.True(t, ok)
	got, ok, err := cp.LinkAt(live.AppliedSeq)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, want, got)
	require.Equal(t, live.ChainHead, got.String())
	require.NoError(t, cp.Close())

	missing := filepath.Join(t.TempDir(), "missing")
	_, err = projector.OpenCheckpoint(missing)
	require.Error(t, err)
	_, statErr := os.Stat(missing)
	require.ErrorIs(t, statErr, os.ErrNotExist, "opening a missing checkpoint creates nothing")
}
