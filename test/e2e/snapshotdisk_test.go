package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// TestViewsRestoreWaitsForRoomOnAFullDisk: a serve without views whose disk
// has less room than the newest snapshot does not fall back to a rebuild
// (which needs as much room, and would fill the disk later): it says it
// waits, stays not ready in its restoring step, and once space comes back
// restores that snapshot and ends with the views serve had.
func TestViewsRestoreWaitsForRoomOnAFullDisk(t *testing.T) {
	data, np, hp := mountTmpfs(t, 64), servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, np, hp, "--disk-reserve", "off")
	snapshotCalls(t, s, "a", 20)
	m := takeViewsSnapshot(t, s)
	before := caughtUpDigest(t, s)
	require.Equal(t, m.AppliedSeq, before.AppliedSeq)
	s.kill(t)
	require.NoError(t, os.RemoveAll(filepath.Join(data, "views")))

	filler := fillTo(t, data, uint64(m.Size)/2)
	cmd, log := startUnready(t, data, np, hp, "--disk-reserve", "off")
	waitLog(t, log, "no room on the disk to unpack a snapshot", 2*time.Minute)
	unready := addrs(np, hp)
	var body struct {
		Step string `json:"step"`
	}
	resp, err := http.Get(unready.httpURL() + "/readyz")
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "restoring_views", body.Step, "waiting for room is part of the restore")

	require.NoError(t, os.Remove(filler))
	waitLog(t, log, "views restored from a snapshot", 2*time.Minute)
	s = &server{&servetest.Server{Bin: binary, Cmd: cmd, Data: data, NATSPort: np, HTTPPort: hp, Log: log}}
	require.Equal(t, before, caughtUpDigest(t, s), "the restored views are the ones serve had")
	require.Contains(t, log.String(), m.Name)
	require.NotContains(t, log.String(), "rebuilding the views from the ledger", "a full disk is waited out, not rebuilt around")
	require.NotContains(t, log.String(), "snapshot refused", "a full disk refuses no snapshot")
}
