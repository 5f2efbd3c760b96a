package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
	"github.com/cgledger/cgledger/protocol"
)

// TestMCPRoleSurvivesAServeKill: serve runs the MCP bridge as its mcp role
// in front of server-everything; a call through it succeeds; serve killed
// (-9) while a side_effectful MCP call runs, and restarted, leaves that
// call with exactly one outcome, failed (outcome_unknown, never run
// twice), and verify passes.
func TestMCPRoleSurvivesAServeKill(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Skip(t, "node is not installed")
	}
	main, err := filepath.Abs(filepath.Join("..", "mcp", "servers", "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"))
	require.NoError(t, err)
	if _, err := os.Stat(main); err != nil {
		testenv.Skip(t, "server-everything is not installed (make tools): %v", err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bridge.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`project: demo
servers:
  - name: everything
    prefix: ""
    command: [%q, %q, stdio]
    tools:
      trigger-long-running-operation: {determinism: side_effectful}
`, node, main)), 0o600))
	data := filepath.Join(dir, "data")
	natsPort, httpPort := servetest.FreePort(t), servetest.FreePort(t)
	flags := []string{"--roles", "api,executor,projector,mcp", "--mcp-bridge", cfg}
	s := startServer(t, data, natsPort, httpPort, flags...)

	out, code := s.run(t, "call", "--project", "demo", "--agent", "a1", "--tool", "get-sum", "--args", `{"a":2,"b":3}`)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "The sum of 2 and 3 is 5")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "call", "--project", "demo", "--agent", "a1", "--tool", "trigger-long-running-operation",
		"--args", `{"duration":5,"steps":5}`, "--turn", "t1", "--call-id", "k1", "--timeout", "10s")
	cmd.Env = append(os.Environ(), "CGLEDGER_NATS_URL="+s.natsURL(), "CGLEDGER_SERVER="+s.httpURL(), "CGLEDGER_DATA="+data)
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	// Made side_effectful by the configuration, the tool's attempt is on
	// record before it runs: then serve is killed mid-call.
	require.Eventually(t, func() bool {
		return callEntryCounts(t, s, "k1")[string(protocol.KindAttempt)] == 1
	}, time.Minute, 100*time.Millisecond, "the call runs")
	s.kill(t)
	s = startServer(t, data, natsPort, httpPort, flags...)
	st := waitReported(t, s, "t1", "k1")
	require.Equal(t, protocol.StatusFailed, st.Status, "never run again after the ambiguous attempt: outcome_unknown")
	n := callEntryCounts(t, s, "k1")
	require.Equal(t, 1, n[string(protocol.KindReport)], "one report: %v", n)
	// The agent has no worker on the roster: its wakeup is recorded as
	// skipped, once.
	require.Equal(t, 1, n[string(protocol.KindWakeup)]+n[string(protocol.KindWakeupSkipped)], "one wakeup: %v", n)
	out, code = s.run(t, "verify")
	require.Equal(t, 0, code, out)
}
