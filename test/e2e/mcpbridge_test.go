package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
	"github.com/cgledger/cgledger/protocol"
)

// everythingServer is server-everything's command line for a bridge
// configuration, or the test skips (fails in CI) without node or it.
func everythingServer(t *testing.T) (node, main string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Skip(t, "node is not installed")
	}
	main, err = filepath.Abs(filepath.Join("..", "mcp", "servers", "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"))
	require.NoError(t, err)
	if _, err := os.Stat(main); err != nil {
		testenv.Skip(t, "server-everything is not installed (make tools): %v", err)
	}
	return node, main
}

// TestMCPBridgeOnAToolCredential: `cgledger mcp bridge` in a process of its
// own, serving on a tool credential bound to the server's target and
// registering with an admin credential, answers calls through serve, and
// stops cleanly on SIGTERM.
func TestMCPBridgeOnAToolCredential(t *testing.T) {
	node, main := everythingServer(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bridge.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf("servers:\n  - name: everything\n    command: [%q, %q, stdio]\n", node, main)), 0o600))
	data := filepath.Join(dir, "data")
	s := startServer(t, data, servetest.FreePort(t), servetest.FreePort(t))
	// A bad configuration is refused with every violation, exit 2.
	out, errOut, code := s.runAll(t, "mcp", "bridge", "--config", cfg)
	require.Equal(t, 2, code, out)
	require.Contains(t, errOut, "project: is required (required)")
	toolCreds := filepath.Join(dir, "tool.creds")
	out, code = s.run(t, "creds", "issue", "--out", toolCreds, "--project", "demo", "--role", "tool", "--tool", "mcp_everything")
	require.Equal(t, 0, code, out)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log servetest.LogBuffer
	bridge := exec.CommandContext(ctx, binary, "mcp", "bridge", "--config", cfg, "--project", "demo", "--creds", toolCreds,
		"--admin-creds", filepath.Join(data, "auth", "admin.creds"), "--nats-url", s.natsURL())
	bridge.Stdout, bridge.Stderr = &log, &log
	require.NoError(t, bridge.Start())
	exited := make(chan error, 1)
	go func() { exited <- bridge.Wait() }()
	t.Cleanup(func() {
		cancel()
		if t.Failed() {
			t.Logf("bridge log:\n%s", log.String())
		}
	})

	require.Eventually(t, func() bool {
		out, code := s.run(t, "tools", "list", "--project", "demo")
		return code == 0 && strings.Contains(out, "everything_get-sum")
	}, time.Minute, 200*time.Millisecond, "the bridge registers the tools")
	out, code = s.run(t, "call", "--project", "demo", "--agent", "a1", "--tool", "everything_get-sum", "--args", `{"a":20,"b":22}`)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "The sum of 20 and 22 is 42")
	require.NotContains(t, log.String(), "Permissions Violation", "the tool credential is enough to serve")

	require.NoError(t, bridge.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit 0 after a clean stop")
	case <-time.After(time.Minute):
		t.Fatal("the bridge did not stop on SIGTERM")
	}
}

// TestMCPRoleSurvivesAServeKill: serve runs the MCP bridge as its mcp role
// in front of server-everything; a call through it succeeds; serve killed
// (-9) while a side_effectful MCP call runs, and restarted, leaves that
// call with exactly one outcome, failed (outcome_unknown, never run
// twice), and verify passes.
func TestMCPRoleSurvivesAServeKill(t *testing.T) {
	node, main := everythingServer(t)
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

// TestMCPRoleSettingsAreChecked: the mcp role needs mcp_bridge, mcp_bridge
// needs the role, and check-config lists every problem of the bridge file
// under mcp_bridge.
func TestMCPRoleSettingsAreChecked(t *testing.T) {
	s := addrs(servetest.FreePort(t), servetest.FreePort(t))
	fields := func(args ...string) []string {
		t.Helper()
		out, code := s.run(t, append([]string{"check-config"}, args...)...)
		require.Equal(t, 2, code, out)
		var cc struct {
			Violations []struct {
				Field string `json:"field"`
				Code  string `json:"code"`
			} `json:"violations"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &cc))
		var fs []string
		for _, v := range cc.Violations {
			fs = append(fs, v.Field+":"+v.Code)
		}
		return fs
	}
	require.Equal(t, []string{"mcp_bridge:required"}, fields("--roles", "api,mcp"))
	cfg := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("project: demo\nservers: [{name: x, target: echo}]\n"), 0o600))
	require.Equal(t, []string{"mcp_bridge:invalid_value"}, fields("--mcp-bridge", cfg))
	require.ElementsMatch(t, []string{"mcp_bridge.servers[0].target:reserved", "mcp_bridge.servers[0].command:required"}, fields("--roles", "api,mcp", "--mcp-bridge", cfg))
	require.NoError(t, os.WriteFile(cfg, []byte("project: demo\nservers: [{name: x, command: [x]}]\n"), 0o600))
	out, code := s.run(t, "check-config", "--roles", "api,mcp", "--mcp-bridge", cfg)
	require.Equal(t, 0, code, out)
}
