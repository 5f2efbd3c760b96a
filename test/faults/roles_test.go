package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/stream"
)

// appliedSeq reads applied_seq from s's GET /v1/digest (docs/audit-api.md);
// s runs the projector role and no authentication.
func (s *serve) appliedSeq() (uint64, error) {
	resp, err := httpClient.Get(s.httpURL() + "/v1/digest")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /v1/digest: %s", resp.Status)
	}
	var d struct {
		AppliedSeq *uint64 `json:"applied_seq"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return 0, fmt.Errorf("GET /v1/digest: %w", err)
	}
	if d.AppliedSeq == nil {
		return 0, fmt.Errorf("GET /v1/digest: no applied_seq")
	}
	return *d.AppliedSeq, nil
}

// TestKillRoleSplitServes: one standalone nats-server and `serve` processes
// split by role on it (`--roles api`, two `--roles executor`, one
// `--roles projector`, each with its own data directory and ports). At each
// kill point an executor-only process (one of the two, at random) or the
// projector-only process, alternately, is killed with SIGKILL and restarted
// while the load goes on through the api process and the other executor.
// Then the checker runs, and the projector's views must catch up with the
// whole stream.
func TestKillRoleSplitServes(t *testing.T) {
	t.Parallel()
	rng := testRand(t)
	ns := newNATSServer(t, "nats")
	ns.start()
	ns.waitHealthy()
	api := newExternalServe(t, "serve-api", ns.url(), "--roles", "api")
	executors := []*serve{
		newExternalServe(t, "serve-executor-1", ns.url(), "--roles", "executor"),
		newExternalServe(t, "serve-executor-2", ns.url(), "--roles", "executor"),
	}
	proj := newExternalServe(t, "serve-projector", ns.url(), "--roles", "projector")
	all := append([]*serve{api, proj}, executors...)
	// All start at once: they provision the same stream and bucket concurrently.
	for _, s := range all {
		s.start()
	}
	for _, s := range all {
		s.waitReady()
	}

	nc := connect(t, ns.url(), nil)
	l := startLoad(t, loadSpec{nc: nc, project: project, channel: "main", agent: "a1", tool: "echo", target: "echo",
		calls: callsPerRun, runID: runID()})
	gaps := killGaps(rng, iterations, callsPerRun)
	// Alternate between an executor and the projector, starting with either.
	first := rng.IntN(2)
	from := 0
	for i, gap := range gaps {
		waitProgress(t, "acknowledged calls", from, gap, l.Acked)
		victim := proj
		if (i+first)%2 == 0 {
			victim = executors[rng.IntN(len(executors))]
		}
		jitter(rng)
		victim.kill()
		t.Logf("kill %d/%d: %s killed at %d dispatches started, %d acknowledged", i+1, len(gaps), victim.name, l.Started(), l.acked.Load())
		victim.startReady()
		from = l.Acked()
	}
	l.settleAndCheck(len(gaps), func() (*ledgerView, error) { return exportVia(api) })

	// The projector-only process's views catch up with the whole stream.
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var applied, last uint64
	var lastErr error
	caughtUp := waitFor(readyTimeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream.DefaultName)
		if err != nil {
			lastErr = err
			return false
		}
		last = st.CachedInfo().State.LastSeq
		if applied, err = proj.appliedSeq(); err != nil {
			lastErr = err
			return false
		}
		return last > 0 && applied >= last
	})
	require.True(t, caughtUp, "%s applied_seq %d reaches the stream's last sequence %d within %s (last error: %v)",
		proj.name, applied, last, readyTimeout, lastErr)
	require.Equal(t, last, applied, "%s applied_seq is the stream's last sequence", proj.name)
	t.Logf("%s caught up: applied_seq=%d stream last_seq=%d", proj.name, applied, last)

	for _, s := range all {
		require.True(t, waitFor(readyTimeout, func() bool { return s.exited() || httpOK(s.httpURL()+"/readyz") }),
			"%s GET /readyz is 200", s.name)
		require.False(t, s.exited(), "%s is running", s.name)
	}
	for _, s := range all {
		s.requireNoCrash()
	}
	ns.requireNoCrash()
}
