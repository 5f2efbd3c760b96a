// Package front tests the ledger as an MCP server (docs/mcp.md) from the
// outside, with clients no one here wrote: the Go SDK's (over stdio through
// `cgledger mcp serve`, and over HTTP), the TypeScript SDK's, and the MCP
// conformance suite, against the built binary.
package front

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cgledger-mcpfront-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if binary, err = servetest.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is a running `cgledger serve` (servetest.Server).
type server struct{ *servetest.Server }

func (s *server) natsURL() string { return s.NATSURL() }
func (s *server) httpURL() string { return s.HTTPURL() }
func (s *server) env() []string   { return s.Env() }

// startServer runs `cgledger serve` (with extra flags) on free ports and a
// fresh data directory until the test ends.
func startServer(t *testing.T, extra ...string) *server {
	t.Helper()
	return &server{servetest.Start(t, binary, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t), extra...)}
}

// run runs a client verb of the binary against s.
func (s *server) run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return s.Run(t, args...)
}

// credential is a file from `cgledger creds issue` and its JWT.
type credential = servetest.Credential

func (s *server) issue(t *testing.T, args ...string) credential {
	t.Helper()
	return s.Issue(t, args...)
}

// clients is test/mcp/clients: its Node 22 and installed packages, or a
// skip (a failure under CGLEDGER_CI=1) when `make tools` has not run.
func clients(t *testing.T) (dir, node string) {
	t.Helper()
	dir, err := filepath.Abs("../clients")
	require.NoError(t, err)
	node = filepath.Join(dir, "node_modules", "node", "bin", "node")
	for _, p := range []string{node, filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json"),
		filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")} {
		if _, err := os.Stat(p); err != nil {
			testenv.Skip(t, "%s is missing: run make tools (npm ci in test/mcp/clients)", p)
		}
	}
	return dir, node
}
