// Package conformanceci runs `cgledger conformance` as CI does against the MCP bridge (npm MCP
// servers served by serve's mcp role) and serve's built-in executor (docs/conformance.md, "In
// CI"); test/sdkts runs it against the TypeScript SDK's example tool service.
package conformanceci

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
	"github.com/cgledger/cgledger/test/confrun"
)

func build(t *testing.T) string {
	t.Helper()
	bin, err := servetest.Build(t.TempDir())
	require.NoError(t, err)
	return bin
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	f, err := filepath.Abs(filepath.Join("..", "..", "conformance", "fixtures", name))
	require.NoError(t, err)
	return f
}

// The cases every conforming tool passes, whatever it can produce.
var everyTool = []string{
	"normal", "status_success", "metadata_verbatim", "traceparent_child", "after_execution_kept",
	"command_missing_call_id", "command_inline_args", "command_unknown_card", "command_identity_mismatch",
	"redelivery_after_report", "duplicate_command", "canceled_call",
}

// The running-call cases, which need the fixture's long call.
var longCall = []string{"redelivery_before_report", "canceled_while_running", "deadline_timeout_once", "heartbeats_long_call"}

func with(base []string, more ...string) []string {
	return append(append([]string{}, base...), more...)
}

// nodeServer is the entry point of an npm MCP server of test/mcp/servers (make tools installs
// them with npm ci).
func nodeServer(t *testing.T, pkg string) (node, main string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Skip(t, "node is not installed: the MCP bridge's conformance run needs the npm MCP servers")
	}
	main, err = filepath.Abs(filepath.Join("..", "mcp", "servers", "node_modules", "@modelcontextprotocol", pkg, "dist", "index.js"))
	require.NoError(t, err)
	if _, err := os.Stat(main); err != nil {
		testenv.Skip(t, "%s is not installed (make tools, or npm ci in test/mcp/servers): %v", pkg, err)
	}
	return node, main
}

// TestConformanceMCPBridge: the MCP bridge, as serve's mcp role, serving server-everything
// (get-sum, trigger-long-running-operation: pure) and server-memory (create_entities:
// side_effectful, MCP's default), each tool checked with its fixture of conformance/fixtures.
// Serve keeps the tool consumers, which the bridge pulls, at a 1 s ack wait (--tool-ack-wait) so
// that the heartbeat case applies to a 2.5 s call; the bridge's executor keeps its default 5 s and
// heartbeats by the consumer's, the shorter. Every case that applies passes; docs/conformance.md says why the others cannot.
func TestConformanceMCPBridge(t *testing.T) {
	node, everything := nodeServer(t, "server-everything")
	_, memory := nodeServer(t, "server-memory")
	bin := build(t)
	cfg := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`project: demo
servers:
  - name: everything
    command: [%q, %q, stdio]
    target: mcp_everything
  - name: memory
    command: [%q, %q]
    target: mcp_memory
    env: {MEMORY_FILE_PATH: %q}
`, node, everything, node, memory, filepath.Join(t.TempDir(), "memory.jsonl"))), 0o600))
	s := confrun.StartServe(t, bin, "--roles", "api,projector,mcp", "--mcp-bridge", cfg, "--tool-ack-wait", "1s")

	for _, c := range []struct {
		tool, fixture string
		pass, racy    []string
	}{
		{"mcp_everything", "mcp-everything-get-sum.yaml", with(everyTool, "status_failed"), nil},
		{"mcp_everything", "mcp-everything-long-running.yaml", with(everyTool, append([]string{"status_failed", "status_timeout"}, longCall...)...), nil},
		{"mcp_memory", "mcp-memory-create-entities.yaml", with(everyTool, "status_failed", "side_effect_intent"), []string{"side_effect_reconcile"}},
	} {
		t.Run(c.fixture, func(t *testing.T) {
			rep := s.Conformance(t, "demo", c.tool, fixture(t, c.fixture))
			confrun.RequireApplies(t, rep, c.pass, c.racy...)
		})
	}
}

// TestConformanceBuiltinExecutor: serve's built-in executor, echo and sleep with their fixtures,
// the executor's ack wait 1 s (--ack-wait) so that the heartbeat case applies to sleep's 2.5 s
// call.
func TestConformanceBuiltinExecutor(t *testing.T) {
	s := confrun.StartServe(t, build(t), "--roles", "api,executor,projector", "--ack-wait", "1s")
	for _, c := range []struct {
		tool string
		pass []string
	}{
		{"echo", everyTool},
		{"sleep", with(everyTool, append([]string{"status_failed", "status_timeout"}, longCall...)...)},
	} {
		t.Run(c.tool, func(t *testing.T) {
			rep := s.Conformance(t, "demo", c.tool, fixture(t, c.tool+".yaml"))
			confrun.RequireApplies(t, rep, c.pass)
		})
	}
}
