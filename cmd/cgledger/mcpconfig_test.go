package main

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger/ledgertest"
)

// TestCheckConfigMCPBridge: check-config reads the bridge file with the
// field names of docs/mcp.md (limits' timeout_ms_default) and lists an
// unknown field beside the file's other problems, under mcp_bridge.
func TestCheckConfigMCPBridge(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bridge.yaml")
	s := defaultSettings()
	s.Roles = []string{"api", "mcp"}
	s.MCPBridge = cfg
	fields := func() map[string]string {
		out := map[string]string{}
		for _, v := range s.validate() {
			out[v.Field] = v.Code
		}
		return out
	}
	require.NoError(t, os.WriteFile(cfg, []byte("project: demo\nservers: [{name: x, command: [x], limits: {timeout_ms_default: 30000, timeout_ms_max: 300000}}]\n"), 0o600))
	require.Empty(t, fields())
	require.NoError(t, os.WriteFile(cfg, []byte("project: demo\nservers: [{name: x, command: [x], url: http://x, target: echo, colour: red}]\n"), 0o600))
	require.Equal(t, map[string]string{
		"mcp_bridge.servers[0].colour": "invalid_value",
		"mcp_bridge.servers[0].url":    "invalid_value",
		"mcp_bridge.servers[0].target": "reserved",
	}, fields())
}

// TestMCPBridgeUnreachableServerExits3: the standalone bridge whose server
// nobody answers at start exits 3, the code of cli.md for "cannot be
// reached".
func TestMCPBridgeUnreachableServerExits3(t *testing.T) {
	ns := natstest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	cfg := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("project: demo\nservers: [{name: x, url: \"http://"+addr+"/mcp\", connect_timeout_ms: 5000}]\n"), 0o600))
	t.Setenv("CGLEDGER_DATA", t.TempDir())
	require.Equal(t, exitUnreachable, mcpBridge([]string{"--config", cfg, "--nats-url", ns.URL(), "--creds", ""}))
}

// TestMCPRoleStartsWithAServerUnreachable: serve's mcp role starts (and so
// serve goes on) when a server nobody answers is configured: the bridge
// retries it, logged.
func TestMCPRoleStartsWithAServerUnreachable(t *testing.T) {
	env := ledgertest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	cfg := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("project: demo\nservers: [{name: x, url: \"http://"+addr+"/mcp\", restart_min_ms: 50, restart_max_ms: 100}]\n"), 0o600))
	s := defaultSettings()
	s.MCPBridge = cfg
	var logs syncBuffer
	stop, err := startMCPBridge(ledgertest.Ctx(t), s, env.L, env.NC, slog.New(slog.NewTextHandler(&logs, nil)), nil)
	require.NoError(t, err)
	t.Cleanup(stop)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "MCP server restart failed") }, time.Minute, 20*time.Millisecond)
	require.Contains(t, logs.String(), "MCP server unreachable at start")
}

// syncBuffer is a bytes.Buffer safe for a logger's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
