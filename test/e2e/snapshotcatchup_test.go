package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// TestViewsRestoreKilledDuringItsCatchUp: serve without views restores a
// snapshot that is thousands of entries behind the stream and is killed
// (SIGKILL) while it catches up from the snapshot's sequence. Started
// again, it keeps the restored, partly caught-up views (no second
// restore), catches up, and ends with the digest the views had before; the
// chain verifies.
func TestViewsRestoreKilledDuringItsCatchUp(t *testing.T) {
	data, np, hp := t.TempDir(), servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, np, hp)
	snapshotCalls(t, s, "a", 2)
	m := takeViewsSnapshot(t, s)
	// Enough entries after the snapshot that its catch-up takes a while.
	dispatchEchoCalls(t, s, "after", 3000)
	before := caughtUpDigest(t, s)
	require.Greater(t, before.AppliedSeq, m.AppliedSeq+10000)
	s.kill(t)

	// A kill that lands after the catch-up ended tests nothing: try again
	// from no views until one lands inside it.
	landed := false
	for attempt := 0; attempt < 5 && !landed; attempt++ {
		require.NoError(t, os.RemoveAll(filepath.Join(data, "views")))
		cmd, log := startUnready(t, data, np, hp)
		waitLog(t, log, "views restored from a snapshot: catching up", 2*time.Minute)
		kill9(t, cmd)
		landed = !strings.Contains(log.String(), "projector caught up")
		t.Logf("attempt %d: killed during the catch-up: %v", attempt, landed)
	}
	require.True(t, landed, "a kill landed during the catch-up after a restore")

	s = startServer(t, data, np, hp)
	require.Equal(t, before, caughtUpDigest(t, s), "the restored views, caught up after the kill, are the ones serve had")
	require.NotContains(t, s.Log.String(), "views: restoring", "views that are there (restored, partly caught up) are not restored again")
	out, code := s.run(t, "verify", "--json")
	require.Equal(t, 0, code, out)
}
