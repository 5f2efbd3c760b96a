// Package front tests the ledger as an MCP server (docs/mcp.md) from the
// outside, with clients no one here wrote: the Go SDK's (over stdio through
// `cgledger mcp serve`, and over HTTP), the TypeScript SDK's, and the MCP
// conformance suite, against the built binary.
package front

import (
	"context"
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

// server is a running `cgledger serve`.
type server struct {
	cmd      *exec.Cmd
	data     string
	natsPort int
	httpPort int
	log      *servetest.LogBuffer
}

func (s *server) natsURL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.natsPort) }
func (s *server) httpURL() string { return fmt.Sprintf("http://127.0.0.1:%d", s.httpPort) }

func startServer(t *testing.T, extra ...string) *server {
	t.Helper()
	s := &server{data: t.TempDir(), natsPort: servetest.FreePort(t), httpPort: servetest.FreePort(t), log: &servetest.LogBuffer{}}
	s.cmd = exec.Command(binary, append([]string{"serve", "--data", s.data,
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", s.natsPort), "--http-listen", fmt.Sprintf("127.0.0.1:%d", s.httpPort), "--log-format", "json"}, extra...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, s.cmd.Start())
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		_ = s.cmd.Wait()
		if t.Failed() {
			t.Logf("serve log:\n%s", s.log.String())
		}
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get(s.httpURL() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 50*time.Millisecond, "serve becomes ready")
	return s
}

// run runs a client verb of the binary against s.
func (s *server) run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = s.env()
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return out.String(), errOut.String(), code
}

func (s *server) env() []string {
	return append(os.Environ(), "CGLEDGER_NATS_URL="+s.natsURL(), "CGLEDGER_SERVER="+s.httpURL(), "CGLEDGER_DATA="+s.data)
}

// credential is a file from `cgledger creds issue` and its JWT.
type credential struct {
	path string
	jwt  string
}

func (s *server) issue(t *testing.T, args ...string) credential {
	t.Helper()
	path := filepath.Join(t.TempDir(), "user.creds")
	out, errOut, code := s.run(t, append([]string{"creds", "issue", "--json", "--out", path}, args...)...)
	require.Equal(t, 0, code, errOut)
	var c struct {
		JWT string `json:"jwt"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &c))
	return credential{path: path, jwt: c.JWT}
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
