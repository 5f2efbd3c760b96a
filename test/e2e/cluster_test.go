package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/internal/servetest"
)

// clusterServe is a `cgledger serve` on an external cluster, and whether it
// has exited.
type clusterServe struct {
	cmd      *exec.Cmd
	httpPort int
	log      *servetest.LogBuffer
	exited   chan struct{}
}

// startClusterServe runs serve against natsURL (R3, no auth) until the test
// ends, without waiting for it to be ready.
func startClusterServe(t *testing.T, data, natsURL string) *clusterServe {
	t.Helper()
	s := &clusterServe{httpPort: servetest.FreePort(t), log: &servetest.LogBuffer{}, exited: make(chan struct{})}
	s.cmd = exec.Command(binary, "serve", "--data", data, "--nats-url", natsURL, "--replicas", "3", "--no-auth",
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", s.httpPort), "--log-format", "json")
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, s.cmd.Start())
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			t.Logf("serve log:\n%s", s.log.String())
		}
	})
	return s
}

func (s *clusterServe) hasExited() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// ready waits (up to two minutes: leader elections on a loaded machine)
// until /readyz answers 200, failing at once if serve exits.
func (s *clusterServe) ready(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		if s.hasExited() {
			return true
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", s.httpPort))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 2*time.Minute, 50*time.Millisecond, "serve becomes ready once the cluster answers")
	require.False(t, s.hasExited(), "serve exited instead of waiting for the cluster")
}

// TestServeWaitsForTheClusterAtStart: serve (re)started while its R3 stream
// has no leader (one node of three up, no quorum) waits, retrying each
// start-up step and logging it, instead of exiting; once the other nodes
// are back it becomes ready.
func TestServeWaitsForTheClusterAtStart(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	data := t.TempDir()
	// A first serve provisions the stream, the bucket and the executor's
	// consumers, as on a running cluster.
	first := startClusterServe(t, data, c.Node(0).URL())
	first.ready(t)
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-first.exited:
	case <-time.After(time.Minute):
		t.Fatal("serve did not stop within a minute of SIGTERM")
	}

	// The whole cluster restarts; one node comes back first, alone: no
	// meta leader, no stream leader.
	for i := range c.Size() {
		c.Node(i).Shutdown()
	}
	c.Start(t, 0)
	s := startClusterServe(t, data, c.Node(0).URL())
	// Another, on a data directory of its own, is stopped while it waits.
	stopped := startClusterServe(t, t.TempDir(), c.Node(0).URL())
	// The first step that reads the cluster is the one waiting: the
	// restore's look for a snapshot when the views are missing or never
	// applied an entry (docs/views.md#snapshots), else the stream.
	for _, p := range []*clusterServe{s, stopped} {
		require.Eventually(t, func() bool {
			return p.hasExited() || strings.Contains(p.log.String(), "serve waits and retries")
		}, time.Minute, 50*time.Millisecond, "serve logs that it waits for the cluster")
		require.False(t, p.hasExited(), "serve exited while the stream had no leader")
		require.Regexp(t, `"step":"(open the views snapshots|read the ledger stream)"`, p.log.String(), "the first step that reads the cluster is the one waiting")
	}
	require.NoError(t, stopped.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-stopped.exited:
		require.Equal(t, 0, stopped.cmd.ProcessState.ExitCode(), "a stop while waiting for the cluster is a clean exit")
	case <-time.After(time.Minute):
		t.Fatal("serve waiting for the cluster did not stop within a minute of SIGTERM")
	}

	c.Start(t, 1)
	c.Start(t, 2)
	s.ready(t)

	// /metrics names the stream leader and counts current replicas, for
	// an operator without a system-account user.
	leader := regexp.MustCompile(`(?m)^cgledger_stream_leader\{leader="(n[123])",stream="CG_LEDGER"\} 1$`)
	var metrics string
	require.Eventually(t, func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", s.httpPort))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		metrics = string(b)
		return err == nil && leader.MatchString(metrics) &&
			strings.Contains(metrics, `cgledger_stream_replicas_current{stream="CG_LEDGER"} 3`)
	}, time.Minute, 100*time.Millisecond, "the stream leader and three current replicas on /metrics")
	name := leader.FindStringSubmatch(metrics)[1]
	for i := range c.Size() {
		if c.Node(i).Name() == name {
			require.NotNil(t, c.Node(i).NATS(), "the leader named is a running node")
		}
	}
}
