package e2e

import (
	be "encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// formatOneViews replaces dir with views as views format 1 left them:
// Pebble's default comparer and a checkpoint at applied (the rest of the
// rows do not matter to the checks at start).
func formatOneViews(t *testing.T, dir string, applied uint64) {
	t.Helper()
	require.NoError(t, os.RemoveAll(dir))
	db, err := pebble.Open(dir, &pebble.Options{})
	require.NoError(t, err)
	cp := be.BigEndian.AppendUint64(nil, applied)
	cp = append(cp, make([]byte, 32+8)...)
	require.NoError(t, db.Set([]byte("meta\x00applied"), cp, pebble.Sync))
	require.NoError(t, db.Close())
}

// stillFormatOne checks that dir was left as it was: Pebble's default
// comparer opens it, and its checkpoint is applied.
func stillFormatOne(t *testing.T, dir string, applied uint64) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true})
	require.NoError(t, err, "the views are left as they were")
	defer db.Close()
	v, closer, err := db.Get([]byte("meta\x00applied"))
	require.NoError(t, err)
	defer closer.Close()
	require.Equal(t, applied, be.BigEndian.Uint64(v))
}

// TestViewsOfAnOlderFormatAreRebuiltOnlyWhenTheLedgerHasThem covers the
// start of a release with another views format: views the ledger can give
// back are rebuilt; views that hold more than the stream (a stream restored
// from an older backup) or entries lost before they were archived are left
// as they are, and serve refuses, on every start.
func TestViewsOfAnOlderFormatAreRebuiltOnlyWhenTheLedgerHasThem(t *testing.T) {
	data := t.TempDir()
	np, hp := servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, np, hp, "--no-auth")
	out, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"x":1}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 0, code, out)
	var rz readyz
	require.Equal(t, 200, getOpen(t, s.httpURL()+"/readyz", &rz))
	last := rz.LastSeq
	s.kill(t)
	views := filepath.Join(data, "views")
	args := []string{"--data", data, "--no-auth", "--nats-listen", fmt.Sprintf("127.0.0.1:%d", np), "--http-listen", fmt.Sprintf("127.0.0.1:%d", hp)}

	// Views past the stream's end: the stream was restored from an older
	// backup. Refused before anything is changed, at every start.
	formatOneViews(t, views, last+50)
	for range 2 {
		out := serveFails(t, args...)
		require.Contains(t, out, "must be rebuilt")
		require.Contains(t, out, fmt.Sprintf("ends at seq %d, behind the views", last))
		stillFormatOne(t, views, last+50)
	}

	// Views holding entries that expired unarchived.
	formatOneViews(t, views, last)
	archive := filepath.Join(data, "archive")
	require.NoError(t, os.MkdirAll(archive, 0o750))
	marker := filepath.Join(archive, fmt.Sprintf("lost-%020d-%020d.json", 2, 3))
	require.NoError(t, os.WriteFile(marker, []byte(`{"first_seq":2,"last_seq":3}`), 0o600))
	out = serveFails(t, args...)
	require.Contains(t, out, "they hold entries 2-3, which expired before they were archived")
	require.Contains(t, out, "remove "+views)
	stillFormatOne(t, views, last)

	// Views that had stepped over that loss themselves lose nothing: they
	// are rebuilt.
	formatOneViews(t, views, last)
	db, err := pebble.Open(views, &pebble.Options{})
	require.NoError(t, err)
	require.NoError(t, db.Set(append([]byte("lost\x00"), be.BigEndian.AppendUint64(nil, 2)...), be.BigEndian.AppendUint64(nil, 3), pebble.Sync))
	require.NoError(t, db.Close())
	s = startServer(t, data, np, hp, "--no-auth")
	waitLog(t, s.Log, "views format changed: rebuilding the views from the ledger", time.Minute)
	s.kill(t)

	// Without the loss, the views are rebuilt from the ledger.
	formatOneViews(t, views, last)
	require.NoError(t, os.Remove(marker))
	s = startServer(t, data, np, hp, "--no-auth")
	waitLog(t, s.Log, "views format changed: rebuilding the views from the ledger", time.Minute)
	require.Equal(t, 200, getOpen(t, s.httpURL()+"/readyz", &rz))
	require.Equal(t, last, rz.AppliedSeq)
	var tl struct {
		Items []any `json:"items"`
	}
	require.Equal(t, 200, getOpen(t, s.httpURL()+"/v1/projects/demo/turns/t1/timeline", &tl))
	require.NotEmpty(t, tl.Items)
}
