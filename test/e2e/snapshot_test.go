package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// snapshotCalls runs n echo calls through s (turn t, calls <prefix>0..).
func snapshotCalls(t *testing.T, s *server, prefix string, n int) {
	t.Helper()
	for i := range n {
		_, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", fmt.Sprintf(`{"text":"%s%d"}`, prefix, i),
			"--turn", "t-"+prefix, "--call-id", fmt.Sprintf("%s%d", prefix, i))
		require.Equal(t, 0, code)
	}
}

// takeViewsSnapshot runs `cgledger views snapshot --json` against s and
// answers the snapshot it took.
func takeViewsSnapshot(t *testing.T, s *server) protocol.ViewsSnapshotResult {
	t.Helper()
	out, code := s.run(t, "views", "snapshot", "--json")
	require.Equal(t, 0, code, out)
	var m protocol.ViewsSnapshotResult
	require.NoError(t, json.Unmarshal([]byte(out), &m))
	return m
}

// caughtUpDigest waits until s is ready with its views at the stream's
// last sequence, and answers their digest.
func caughtUpDigest(t *testing.T, s *server) projector.DigestResult {
	t.Helper()
	var d projector.DigestResult
	require.Eventually(t, func() bool {
		resp, err := http.Get(s.httpURL() + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var r struct {
			Applied uint64 `json:"applied_seq"`
			Last    uint64 `json:"last_seq"`
		}
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&r) != nil || r.Last == 0 || r.Applied < r.Last {
			return false
		}
		if s.getJSON(t, s.httpURL()+"/v1/digest", &d) != http.StatusOK {
			return false
		}
		return d.AppliedSeq == r.Last
	}, 2*time.Minute, 50*time.Millisecond, "the views catch up with the ledger")
	return d
}

// waitLog waits until serve's log holds text.
func waitLog(t *testing.T, log *servetest.LogBuffer, text string, limit time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(log.String(), text) }, limit, 10*time.Millisecond, "serve logs %q", text)
}

// startUnready runs `cgledger serve` without waiting for it to be ready:
// for a test that kills it during its start.
func startUnready(t *testing.T, data string, natsPort, httpPort int, extra ...string) (*exec.Cmd, *servetest.LogBuffer) {
	t.Helper()
	log := &servetest.LogBuffer{}
	cmd := exec.Command(binary, append([]string{"serve", "--data", data,
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", natsPort), "--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--log-format", "json"}, extra...)...)
	cmd.Stdout, cmd.Stderr = log, log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			if t.Failed() {
				servetest.DumpGoroutines(cmd)
			}
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("serve (killed during start) log:\n%s", log.String())
		}
	})
	return cmd, log
}

func kill9(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
}

// TestViewsSnapshotOnDemandRestoresAServeWithoutViews: `cgledger views
// snapshot` answers the manifest of views at the ledger's sequence; serve
// started again with its views removed restores that snapshot from the
// Object Store, catches up past it, and ends ready with the digest the
// views had before, which verify and a rebuild (replay of an export) agree
// with.
func TestViewsSnapshotOnDemandRestoresAServeWithoutViews(t *testing.T) {
	data, np, hp := t.TempDir(), servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, np, hp)
	snapshotCalls(t, s, "a", 4)
	at := caughtUpDigest(t, s)

	m := takeViewsSnapshot(t, s)
	require.NoDirExists(t, filepath.Join(data, "snapshots.tmp"), "the checkpoint's directory goes with it")
	require.GreaterOrEqual(t, m.AppliedSeq, at.AppliedSeq)
	require.Equal(t, projector.ViewsFormat, m.ViewsFormat)
	require.Equal(t, "CG_LEDGER", m.Stream)
	require.Contains(t, m.Target, "object store")
	require.Positive(t, m.Size)
	require.Positive(t, m.Files)
	require.True(t, strings.HasPrefix(m.Name, fmt.Sprintf("views-f%d-", projector.ViewsFormat)), m.Name)
	if now := caughtUpDigest(t, s); now.AppliedSeq == m.AppliedSeq {
		require.Equal(t, now.Digest, m.Digest, "the snapshot's digest is the views' at its sequence")
		require.Equal(t, now.ChainHead, m.ChainHead)
	}
	require.Equal(t, 1.0, metricValue(t, s, `cgledger_views_snapshots_total{result="ok"}`))
	require.Equal(t, float64(m.AppliedSeq), metricValue(t, s, "cgledger_views_snapshot_last_seq"))
	out, code := s.run(t, "views", "snapshots", "--json")
	require.Equal(t, 0, code, out)
	var list protocol.ViewsSnapshotListResult
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list.Snapshots, 1)
	listed := list.Snapshots[0]
	require.Equal(t, m.Name, listed.Name)
	require.Equal(t, m.Digest, listed.Digest)
	require.Equal(t, m.Size, listed.Size)

	// Calls after the snapshot: the restored views catch up past it.
	snapshotCalls(t, s, "b", 2)
	before := caughtUpDigest(t, s)
	require.Greater(t, before.AppliedSeq, m.AppliedSeq)
	s.kill(t)
	require.NoError(t, os.RemoveAll(filepath.Join(data, "views")))

	s = startServer(t, data, np, hp)
	after := caughtUpDigest(t, s)
	waitLog(t, s.Log, "views restored from a snapshot", time.Minute)
	require.Contains(t, s.Log.String(), m.Name)
	require.Equal(t, before, after, "restored and caught up, the views are the ones serve had")

	// The chain verifies, and an export replayed into fresh views (a
	// rebuild from sequence 1) has the restored views' digest.
	out, code = s.run(t, "verify", "--json")
	require.Equal(t, 0, code, out)
	var live map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &live))
	require.Equal(t, true, live["ok"])
	export := filepath.Join(t.TempDir(), "ledger.jsonl")
	out, code = s.run(t, "export", "--out", export)
	require.Equal(t, 0, code, out)
	out, code = s.run(t, "replay", export, "--json", "--expect", after.Digest)
	require.Equal(t, 0, code, "a rebuild's digest is the restored views': %s", out)

	// The restored views serve what came after the snapshot.
	out, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"b1"}`, "--turn", "t-b", "--call-id", "b1")
	require.Equal(t, 0, code)
	require.Contains(t, out, `{"text":"b1"}`)
}

// TestViewsSnapshotSurvivesKillsDuringSnapshotAndRestore: serve killed
// (SIGKILL) while it takes a scheduled snapshot starts again with its
// views; serve killed while it restores a snapshot into a data directory
// without views starts again, restores, and ends ready with the digest the
// views had before.
func TestViewsSnapshotSurvivesKillsDuringSnapshotAndRestore(t *testing.T) {
	data, np, hp := t.TempDir(), servetest.FreePort(t), servetest.FreePort(t)
	every := []string{"--views-snapshot-every", "10s"}
	s := startServer(t, data, np, hp, every...)
	snapshotCalls(t, s, "a", 6)
	before := caughtUpDigest(t, s)

	// Killed while the scheduled snapshot runs.
	waitLog(t, s.Log, "views snapshot: taking", 2*time.Minute)
	s.kill(t)
	s = startServer(t, data, np, hp, every...)
	require.Equal(t, before, caughtUpDigest(t, s), "the views are as they were")
	require.NotContains(t, s.Log.String(), "views: restoring", "views that are there are not restored")
	// A whole scheduled snapshot this time.
	waitLog(t, s.Log, "views snapshot taken", 2*time.Minute)
	snapshotCalls(t, s, "b", 2)
	before = caughtUpDigest(t, s)
	s.kill(t)

	// Killed while it restores into a data directory without views.
	require.NoError(t, os.RemoveAll(filepath.Join(data, "views")))
	cmd, log := startUnready(t, data, np, hp, every...)
	waitLog(t, log, "views: restoring the newest snapshot", 2*time.Minute)
	kill9(t, cmd)

	s = startServer(t, data, np, hp, every...)
	require.Equal(t, before, caughtUpDigest(t, s), "restored (at the first start or this one) and caught up, the views are the ones serve had")
	require.Eventually(t, func() bool {
		return strings.Contains(log.String()+s.Log.String(), "views restored from a snapshot")
	}, time.Minute, 10*time.Millisecond, "a snapshot was restored")
	_, err := os.Stat(filepath.Join(data, "views.replaced"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing of the restore is left beside the views")
	_, err = os.Stat(filepath.Join(data, "views.restoring"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestViewsSnapshotNeedsAnAdminOfEveryProject: views.snapshot is refused
// to a worker, an auditor and the admin of one project (NATS permissions:
// the CLI says the credential may not do this, exit 1), and to a client
// without a credential; nothing is taken.
func TestViewsSnapshotNeedsAnAdminOfEveryProject(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	for _, args := range [][]string{
		{"--project", "demo", "--role", "worker", "--agent", "alice"},
		{"--project", "demo", "--role", "auditor"},
		{"--project", "demo", "--role", "admin"},
	} {
		c := s.issue(t, args...)
		_, errOut, code := s.runAll(t, "views", "snapshot", "--creds", c.Path, "--timeout", "1m")
		require.Equal(t, 1, code, "%v", args)
		require.Contains(t, errOut, "may not do this", "%v", args)
		_, errOut, code = s.runAll(t, "views", "snapshots", "--creds", c.Path)
		require.Equal(t, 1, code, "%v", args)
		require.Contains(t, errOut, "may not do this", "%v", args)

		// On the wire: the request is refused by NATS, never answered.
		nc := s.connectAs(t, c)
		_, err := nc.Request(protocol.APISubject(protocol.GlobalProject, "alice", protocol.OpViewsSnapshot), []byte("{}"), 2*time.Second)
		require.Error(t, err, "%v", args)
		require.NotErrorIs(t, err, nats.ErrNoResponders, "the views serve it; NATS refuses this credential")
	}
	_, errOut, code := s.runAll(t, "views", "snapshot", "--creds", "", "--timeout", "1m")
	require.NotEqual(t, 0, code)
	require.Contains(t, strings.ToLower(errOut), "authorization")
	require.Equal(t, 0.0, metricValue(t, s, `cgledger_views_snapshots_total{result="ok"}`))
	require.Equal(t, 0.0, metricValue(t, s, `cgledger_views_snapshots_total{result="failed"}`))
}

// setViewsFormat stamps the (closed) views in data with another views
// format, as a store written by another release would be: Pebble opened
// with a comparer of the views' name (the format row is not split).
func setViewsFormat(t *testing.T, data string, format int) {
	t.Helper()
	cmp := *pebble.DefaultComparer
	cmp.Name = "cgledger.views.v2"
	db, err := pebble.Open(filepath.Join(data, "views"), &pebble.Options{Comparer: &cmp, ErrorIfNotExists: true})
	require.NoError(t, err)
	require.NoError(t, db.Set([]byte("meta\x00format"), []byte(fmt.Sprint(format)), pebble.Sync))
	require.NoError(t, db.Close())
}

// TestViewsOfAnotherFormatRestoreASnapshot: views of another views format
// are replaced by the snapshot, restored and caught up to the digest they
// would have; with no snapshot to restore (an empty views_snapshot_dir)
// they are moved aside, put back and rebuilt from the ledger, to the same
// digest.
func TestViewsOfAnotherFormatRestoreASnapshot(t *testing.T) {
	data, np, hp := t.TempDir(), servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, np, hp)
	snapshotCalls(t, s, "a", 3)
	_, code := s.run(t, "views", "snapshot")
	require.Equal(t, 0, code)
	snapshotCalls(t, s, "b", 2)
	before := caughtUpDigest(t, s)
	s.kill(t)

	setViewsFormat(t, data, projector.ViewsFormat-1)
	s = startServer(t, data, np, hp)
	require.Equal(t, before, caughtUpDigest(t, s))
	waitLog(t, s.Log, "views restored from a snapshot", time.Minute)
	require.Contains(t, s.Log.String(), fmt.Sprintf(`"why":"views of format %d`, projector.ViewsFormat-1))
	require.NotContains(t, s.Log.String(), "views format changed: rebuilding")
	_, err := os.Stat(filepath.Join(data, "views.replaced"))
	require.ErrorIs(t, err, os.ErrNotExist, "the replaced views are removed")
	s.kill(t)

	setViewsFormat(t, data, projector.ViewsFormat-1)
	s = startServer(t, data, np, hp, "--views-snapshot-dir", t.TempDir())
	require.Equal(t, before, caughtUpDigest(t, s))
	waitLog(t, s.Log, "views format changed: rebuilding", time.Minute)
	require.Contains(t, s.Log.String(), "views: no snapshot passes its checks", "moved aside, tried, put back")
}

// TestViewsSnapshotRefusedWhenTheDiskIsShort: with free space below the
// reserve no snapshot starts (views.snapshot answers why, exit 1, counted
// refused) and serve goes on; with room again one is taken.
func TestViewsSnapshotRefusedWhenTheDiskIsShort(t *testing.T) {
	data := mountTmpfs(t, 64)
	s := startServer(t, data, servetest.FreePort(t), servetest.FreePort(t))
	snapshotCalls(t, s, "a", 1)
	filler := fillTo(t, data, 2<<20)
	require.Eventually(t, func() bool {
		code, reason := readiness(t, s)
		return code == http.StatusServiceUnavailable && strings.Contains(reason, "storage nearly full")
	}, time.Minute, 50*time.Millisecond, "serve sees the full disk")
	_, errOut, code := s.runAll(t, "views", "snapshot")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "free disk space is short")
	require.Equal(t, 1.0, metricValue(t, s, `cgledger_views_snapshots_total{result="refused"}`))
	require.Nil(t, s.Cmd.ProcessState, "serve is still running")

	require.NoError(t, os.Remove(filler))
	caughtUpDigest(t, s)
	out, code := s.run(t, "views", "snapshot")
	require.Equal(t, 0, code)
	require.Contains(t, out, "snapshot views-f")
	require.Equal(t, 1.0, metricValue(t, s, `cgledger_views_snapshots_total{result="ok"}`))
}
