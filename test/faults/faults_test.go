package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

const project = "faults"

// credential is what `cgledger creds issue --json` prints.
type credential struct {
	Creds       string `json:"creds"`
	InboxPrefix string `json:"inbox_prefix"`
	path        string
}

// issue runs `cgledger creds issue` with s's keys.
func issue(t *testing.T, s *serve, args ...string) *credential {
	t.Helper()
	out, errOut, code := s.cli(append([]string{"creds", "issue", "--json", "--ttl", "0", "--data", s.data}, args...)...)
	require.Equal(t, 0, code, "creds issue: %s %s", out, errOut)
	var c credential
	require.NoError(t, json.Unmarshal([]byte(out), &c))
	c.path = filepath.Join(t.TempDir(), "user.creds")
	require.NoError(t, os.WriteFile(c.path, []byte(c.Creds), 0o600))
	return &c
}

// connect opens a client connection that reconnects for ever.
func connect(t *testing.T, url string, c *credential) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.Timeout(5 * time.Second)}
	if c != nil {
		opts = append(opts, nats.UserCredentials(c.path), nats.CustomInboxPrefix(c.InboxPrefix))
	}
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// runID goes into every turn id of a run.
func runID() string { return fmt.Sprintf("%x", seed&0xffffffff) }

// waitProgress waits until progress() reaches from+gap (the kill point).
func waitProgress(t *testing.T, what string, from, gap int, progress func() int) {
	t.Helper()
	require.True(t, waitFor(settleTimeout, func() bool { return progress() >= from+gap }), "%s reaches %d (at %d)", what, from+gap, progress())
}

// TestKillServeUnderLoad: kill -9 of `cgledger serve` (embedded nats-server,
// authentication on, as by default) at random points of a load of echo
// calls, restarted on the same data directory each time.
func TestKillServeUnderLoad(t *testing.T) {
	t.Parallel()
	rng := testRand(t)
	s := newEmbeddedServe(t, "serve")
	s.startReady()
	worker := issue(t, s, "--project", project, "--role", "worker", "--agent", "a1")
	nc := connect(t, s.natsURL, worker)

	l := startLoad(t, loadSpec{nc: nc, project: project, channel: "main", agent: "a1", tool: "echo", target: "echo",
		calls: callsPerRun, runID: runID()})
	gaps := killGaps(rng, iterations, callsPerRun)
	from := 0
	for i, gap := range gaps {
		waitProgress(t, "acknowledged calls", from, gap, l.Acked)
		jitter(rng)
		s.kill()
		t.Logf("kill %d/%d: serve killed at %d dispatches started, %d acknowledged", i+1, len(gaps), l.Started(), l.acked.Load())
		s.startReady()
		from = l.Acked()
	}
	l.settleAndCheck(len(gaps), func() (*ledgerView, error) { return exportVia(s) })
	s.requireNoCrash()
}

// TestKillToolService: kill -9 of an external tool service (test/faults/toolsvc,
// a separate process speaking the wire protocol with a tool credential and
// the durable consumer of tool.consumer) at random points while calls to it
// are dispatched; it is restarted each time. Commands it held when killed
// come back after the consumer's ack wait (30 s).
func TestKillToolService(t *testing.T) {
	t.Parallel()
	rng := testRand(t)
	s := newEmbeddedServe(t, "serve")
	s.startReady()
	def := filepath.Join(t.TempDir(), "faultsvc.yaml")
	require.NoError(t, os.WriteFile(def, []byte("tool_name: faultsvc\nparameters: {type: object}\n"+
		"target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.faultsvc\nafter_execution: suspend\n"), 0o600))
	out, errOut, code := s.cli("tools", "register", def, "--project", project)
	require.Equal(t, 0, code, "%s %s", out, errOut)
	tool := issue(t, s, "--project", project, "--role", "tool", "--tool", "faultsvc")
	worker := issue(t, s, "--project", project, "--role", "worker", "--agent", "a1")

	svcLog := newLogBuffer("ready ", "reported ", "refused ")
	svc := newProc(t, "toolsvc", toolsvcBin, nil, svcLog, "-nats-url", s.natsURL, "-creds", tool.path,
		"-inbox-prefix", tool.InboxPrefix, "-project", project, "-target", "faultsvc")
	startSvc := func() {
		readies := svcLog.count("ready ")
		svc.start()
		require.True(t, waitFor(readyTimeout, func() bool { return svc.exited() || svcLog.count("ready ") > readies }), "toolsvc pulls")
		require.False(t, svc.exited(), "toolsvc exited at start")
	}
	startSvc()

	nc := connect(t, s.natsURL, worker)
	reported := func() int { return svcLog.count("reported ") }
	l := startLoad(t, loadSpec{nc: nc, project: project, channel: "main", agent: "a1", tool: "faultsvc", target: "faultsvc",
		calls: callsPerRun, runID: runID(),
		// Keep at most 64 calls ahead of the tool service.
		gate: func(l *load) bool { return l.Started()-reported() < 64 }})
	gaps := killGaps(rng, iterations, callsPerRun)
	from := 0
	for i, gap := range gaps {
		waitProgress(t, "reports by the tool service", from, gap, reported)
		jitter(rng)
		svc.kill()
		t.Logf("kill %d/%d: toolsvc killed at %d reports, %d dispatches started", i+1, len(gaps), reported(), l.Started())
		startSvc()
		from = reported()
	}
	l.settleAndCheck(len(gaps), func() (*ledgerView, error) { return exportVia(s) })
	require.Zero(t, svcLog.count("refused "), "the ledger refused a request of the tool service")
	svc.requireNoCrash()
	s.requireNoCrash()
}

// TestTwoServesOneKilled: two `serve` processes (every role) share one
// standalone nats-server; at each kill point one of them, chosen at random,
// is killed with SIGKILL and restarted while the load goes on through the
// other.
func TestTwoServesOneKilled(t *testing.T) {
	t.Parallel()
	rng := testRand(t)
	ns := newNATSServer(t, "nats")
	ns.start()
	ns.waitHealthy()
	serves := []*serve{newExternalServe(t, "serve-a", ns.url()), newExternalServe(t, "serve-b", ns.url())}
	// Both start at once: they provision the same stream and bucket concurrently.
	for _, s := range serves {
		s.start()
	}
	for _, s := range serves {
		s.waitReady()
	}
	nc := connect(t, ns.url(), nil)
	l := startLoad(t, loadSpec{nc: nc, project: project, channel: "main", agent: "a1", tool: "echo", target: "echo",
		calls: callsPerRun, runID: runID()})
	gaps := killGaps(rng, iterations, callsPerRun)
	from := 0
	for i, gap := range gaps {
		waitProgress(t, "acknowledged calls", from, gap, l.Acked)
		victim := serves[rng.IntN(len(serves))]
		jitter(rng)
		victim.kill()
		t.Logf("kill %d/%d: %s killed at %d dispatches started, %d acknowledged", i+1, len(gaps), victim.name, l.Started(), l.acked.Load())
		victim.startReady()
		from = l.Acked()
	}
	l.settleAndCheck(len(gaps), func() (*ledgerView, error) { return exportVia(serves[0]) })
	// The other process exports the same ledger.
	va, err := exportVia(serves[0])
	require.NoError(t, err)
	vb, err := exportVia(serves[1])
	require.NoError(t, err)
	require.Equal(t, len(va.reports), len(vb.reports), "both serve processes export the same reports")
	for _, s := range serves {
		s.requireNoCrash()
	}
	ns.requireNoCrash()
}

// TestClusterLeaderKill: a 3-node nats-server cluster (child processes), a
// `serve --replicas 3` on it, and at each kill point a node is killed with
// SIGKILL, alternately the ledger stream's leader (restarted on its store
// once another node leads) and a follower (restarted at once).
func TestClusterLeaderKill(t *testing.T) {
	t.Parallel()
	rng := testRand(t)
	cports := []int{freePort(t), freePort(t), freePort(t)}
	var routes []string
	for _, p := range cports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	nodes := map[string]*natsServer{}
	var urls []string
	for i, p := range cports {
		name := fmt.Sprintf("n%d", i+1)
		n := newNATSServer(t, name, "--cluster_name", "cgfaults", "--cluster", fmt.Sprintf("nats://127.0.0.1:%d", p),
			"--routes", strings.Join(routes, ","))
		nodes[name] = n
		urls = append(urls, n.url())
		n.start()
	}
	for _, n := range nodes {
		n.waitHealthy()
	}
	clusterFormed := func() bool {
		for _, n := range nodes {
			if n.leadsFormedCluster(len(nodes)) {
				return true
			}
		}
		return false
	}
	require.True(t, waitFor(readyTimeout, clusterFormed), "the meta leader sees every node current")
	natsURL := strings.Join(urls, ",")
	s := newExternalServe(t, "serve", natsURL, "--replicas", "3")
	s.startReady()
	nc := connect(t, natsURL, nil)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	// clusterState says who leads the ledger stream and whether every stream
	// (ledger and call-record bucket) has a leader and all replicas current.
	clusterState := func() (leader string, healthy bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		healthy = true
		streams := 0
		for name := range js.StreamNames(ctx).Name() {
			streams++
			st, err := js.Stream(ctx, name)
			if err != nil {
				return "", false
			}
			info := st.CachedInfo()
			if info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
				healthy = false
				continue
			}
			for _, r := range info.Cluster.Replicas {
				if !r.Current || r.Offline {
					healthy = false
				}
			}
			if name == "CG_LEDGER" {
				leader = info.Cluster.Leader
			}
		}
		return leader, healthy && streams >= 2 && leader != ""
	}

	l := startLoad(t, loadSpec{nc: nc, project: project, channel: "main", agent: "a1", tool: "echo", target: "echo",
		calls: callsPerRun, runID: runID()})
	gaps := killGaps(rng, iterations, callsPerRun)
	from := 0
	for i, gap := range gaps {
		waitProgress(t, "acknowledged calls", from, gap, l.Acked)
		var leader string
		require.True(t, waitFor(readyTimeout, func() bool {
			var ok bool
			leader, ok = clusterState()
			return ok && clusterFormed()
		}), "the cluster is formed and its streams have a leader and current replicas")
		require.NotNil(t, nodes[leader], "leader %q is one of the nodes", leader)
		// Kills alternate between the stream's leader and a follower.
		victimName, role := leader, "stream leader"
		if i%2 == 1 {
			var followers []string
			for name := range nodes {
				if name != leader {
					followers = append(followers, name)
				}
			}
			sort.Strings(followers)
			victimName, role = followers[rng.IntN(len(followers))], "follower"
		}
		victim := nodes[victimName]
		jitter(rng)
		victim.kill()
		t.Logf("kill %d/%d: %s %s killed at %d dispatches started, %d acknowledged", i+1, len(gaps), role, victimName, l.Started(), l.acked.Load())
		if victimName == leader {
			var next string
			require.True(t, waitFor(readyTimeout, func() bool {
				next, _ = clusterState()
				return next != "" && next != leader
			}), "another node leads the ledger stream after %s died", leader)
		}
		victim.start()
		victim.waitHealthy()
		from = l.Acked()
	}
	l.settleAndCheck(len(gaps), func() (*ledgerView, error) { return exportVia(s) })
	s.requireNoCrash()
	for _, n := range nodes {
		n.requireNoCrash()
	}
}
