package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/snapshot"
)

// startReplica runs `cgledger serve --nats-url url --no-auth` (with extra
// flags) on a data directory of its own until the test ends, without
// waiting for it to be ready. Its client verbs reach url and its HTTP.
func startReplica(t *testing.T, name, url string, extra ...string) *server {
	t.Helper()
	var natsPort int
	_, err := fmt.Sscanf(url, "nats://127.0.0.1:%d", &natsPort)
	require.NoError(t, err, url)
	s := addrs(natsPort, servetest.FreePort(t))
	s.Log = &servetest.LogBuffer{}
	s.Cmd = exec.Command(binary, append([]string{"serve", "--data", t.TempDir(), "--nats-url", url, "--no-auth",
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", s.HTTPPort), "--log-format", "json"}, extra...)...)
	s.Cmd.Stdout, s.Cmd.Stderr = s.Log, s.Log
	require.NoError(t, s.Cmd.Start())
	t.Cleanup(func() {
		if s.Cmd.ProcessState == nil {
			_ = s.Cmd.Process.Kill()
			_ = s.Cmd.Wait()
		}
		if t.Failed() {
			t.Logf("serve %s log:\n%s", name, s.Log.String())
		}
	})
	return s
}

// readyBody is what /readyz answers: its status, body and whether it is
// ready.
func readyBody(t *testing.T, s *server) (int, map[string]any, error) {
	t.Helper()
	resp, err := http.Get(s.httpURL() + "/readyz")
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var body map[string]any
	err = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body, err
}

// replicaReady waits until /readyz of s answers 200.
func replicaReady(t *testing.T, s *server) {
	t.Helper()
	require.Eventually(t, func() bool {
		code, _, err := readyBody(t, s)
		return err == nil && code == http.StatusOK
	}, 2*time.Minute, 50*time.Millisecond, "serve becomes ready")
}

// openDigest waits until s (without authentication) is ready with its
// views at the stream's last sequence and answers their digest.
func openDigest(t *testing.T, s *server) projector.DigestResult {
	t.Helper()
	var d projector.DigestResult
	require.Eventually(t, func() bool {
		code, body, err := readyBody(t, s)
		if err != nil || code != http.StatusOK {
			return false
		}
		last, _ := body["last_seq"].(float64)
		resp, err := http.Get(s.httpURL() + "/v1/digest")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&d) == nil && last > 0 && d.AppliedSeq == uint64(last)
	}, 2*time.Minute, 50*time.Millisecond, "the views catch up with the ledger")
	return d
}

// stopServe sends SIGTERM and waits (a minute) for a clean exit.
func stopServe(t *testing.T, s *server) {
	t.Helper()
	require.NoError(t, s.Cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- s.Cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "a clean exit")
	case <-time.After(time.Minute):
		t.Fatal("serve did not stop within a minute of SIGTERM")
	}
}

// TestServeAnswersProbesWhileItRestoresViews: a fresh replica whose
// restore cannot finish (its R3 snapshot bucket has no quorum) answers
// /healthz 200, /readyz 503 naming the step restoring_views, /metrics, and
// 503 "starting" for the audit API; once the cluster answers it restores
// the snapshot, catches up (every 503 on the way names a reason) and ends
// ready with the digest of the views the snapshot was taken from.
func TestServeAnswersProbesWhileItRestoresViews(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	a := startReplica(t, "a", c.Node(0).URL(), "--replicas", "3")
	replicaReady(t, a)
	snapshotCalls(t, a, "a", 3)
	m := takeViewsSnapshot(t, a)
	snapshotCalls(t, a, "b", 2)
	want := openDigest(t, a)
	require.Greater(t, want.AppliedSeq, m.AppliedSeq, "the restored views have entries to catch up with")
	stopServe(t, a)

	// No quorum: the bucket and the stream do not answer.
	c.Node(1).Shutdown()
	c.Node(2).Shutdown()
	b := startReplica(t, "b", c.Node(0).URL(), "--replicas", "3")
	waitLog(t, b.Log, "serve waits and retries", 2*time.Minute)
	require.Regexp(t, `"step":"(open the views snapshots|restore the views from a snapshot)"`, b.Log.String(), "the restore is the step waiting")

	resp, err := http.Get(b.httpURL() + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "alive while it restores")
	code, body, err := readyBody(t, b)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "not ready", body["status"])
	require.Equal(t, "restoring_views", body["step"], "%v", body)
	require.Equal(t, "restoring views from a snapshot", body["reason"])
	resp, err = http.Get(b.httpURL() + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get(b.httpURL() + "/v1/digest")
	require.NoError(t, err)
	var prob struct {
		Code string `json:"code"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&prob))
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "no views to answer from")
	require.Equal(t, "starting", prob.Code)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))

	c.Start(t, 1)
	c.Start(t, 2)
	steps := map[string]bool{}
	var wrong []map[string]any // 503 bodies without a reason, or with another step
	require.Eventually(t, func() bool {
		code, body, err := readyBody(t, b)
		if err != nil {
			return false
		}
		if code == http.StatusOK {
			return true
		}
		reason, _ := body["reason"].(string)
		step, hasStep := body["step"].(string)
		switch {
		case reason == "":
			wrong = append(wrong, body)
		case hasStep && step != "restoring_views" && step != "starting" && step != "catching_up":
			wrong = append(wrong, body)
		case hasStep:
			steps[step] = true
		}
		return false
	}, 2*time.Minute, 20*time.Millisecond, "the replica becomes ready once the cluster answers")
	require.Empty(t, wrong, "every 503 on the way says why, and names a start-up step if any")
	waitLog(t, b.Log, "views restored from a snapshot", time.Minute)
	require.Contains(t, b.Log.String(), m.Name)
	require.Equal(t, want, openDigest(t, b), "restored and caught up: the views the snapshot was taken from")
	t.Logf("steps seen after the cluster came back: %v", steps)
}

// TestTwoReplicasRestoreOneSnapshotAtOnce: replica A takes a snapshot into
// the Object Store bucket of the ledger; two fresh replicas B and C (views
// of their own, the same nats-server and stream) start at once, both
// restore it and end ready with A's digest, which verify agrees with. Their
// scheduled snapshotters, sharing the bucket, leave it whole: every listed
// snapshot restores on its own with its digest, and after a last snapshot
// the bucket holds views_snapshot_keep of them.
func TestTwoReplicasRestoreOneSnapshotAtOnce(t *testing.T) {
	ns := natstest.Start(t)
	keep := []string{"--views-snapshot-keep", "2"}
	a := startReplica(t, "a", ns.URL(), keep...)
	replicaReady(t, a)
	snapshotCalls(t, a, "a", 3)
	m := takeViewsSnapshot(t, a)
	snapshotCalls(t, a, "b", 2)
	want := openDigest(t, a)

	every := append([]string{"--views-snapshot-every", "10s"}, keep...)
	b := startReplica(t, "b", ns.URL(), every...)
	cc := startReplica(t, "c", ns.URL(), every...)
	for _, r := range []*server{b, cc} {
		require.Equal(t, want, openDigest(t, r), "A's views, restored and caught up")
		waitLog(t, r.Log, "views restored from a snapshot", time.Minute)
		require.Contains(t, r.Log.String(), m.Name)
		out, code := r.run(t, "verify", "--json")
		require.Equal(t, 0, code, out)
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &v))
		require.Equal(t, true, v["ok"], out)
	}

	// The scheduled snapshotters of B and C run on the shared bucket
	// (each takes one, or skips a turn when the other's is recent) until
	// more than keep were taken in all.
	taken := func() int {
		return strings.Count(b.Log.String(), "views snapshot taken") + strings.Count(cc.Log.String(), "views snapshot taken")
	}
	require.Eventually(t, func() bool { return taken() >= 3 }, 2*time.Minute, 100*time.Millisecond, "B and C take scheduled snapshots")
	t.Logf("scheduled snapshots taken: B %d, C %d", strings.Count(b.Log.String(), "views snapshot taken"), strings.Count(cc.Log.String(), "views snapshot taken"))
	stopServe(t, b)
	stopServe(t, cc)

	// A last snapshot (A's): after its prune the bucket holds keep.
	takeViewsSnapshot(t, a)
	out, code := a.run(t, "views", "snapshots", "--json")
	require.Equal(t, 0, code, out)
	var list protocol.ViewsSnapshotListResult
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list.Snapshots, 2, "pruned to views_snapshot_keep: %s", out)

	// Every listed snapshot is whole: copied alone into a directory
	// target, it passes Restore's checks (digest recomputed, chain link).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	bucket, err := snapshot.NewObjectStore(ctx, js, snapshot.BucketName("CG_LEDGER"), 1)
	require.NoError(t, err)
	listed, err := bucket.List(ctx)
	require.NoError(t, err)
	require.Len(t, listed, 2)
	for _, sm := range listed {
		dir, err := snapshot.NewDir(filepath.Join(t.TempDir(), "one"))
		require.NoError(t, err)
		body, err := bucket.Open(ctx, sm.Name)
		require.NoError(t, err)
		require.NoError(t, dir.Put(ctx, sm, body), sm.Name)
		require.NoError(t, body.Close())
		views := filepath.Join(t.TempDir(), "views")
		got, err := snapshot.Restore(ctx, dir, views, snapshot.RestoreOptions{Stream: "CG_LEDGER", JS: js})
		require.NoError(t, err, sm.Name)
		require.Equal(t, sm.Name, got.Name)
		require.Equal(t, sm.Digest, got.Digest)
	}
}
