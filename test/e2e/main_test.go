// Package e2e runs the cgledger binary as a process, as a new user would:
// serve on free ports, call tools, register tools, audit, kill -9, restart,
// and speak the raw wire protocol with nothing but a NATS client.
package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cgledger-e2e-")
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

// server is a running `cgledger serve` process (servetest.Server).
type server struct{ *servetest.Server }

func (s *server) natsURL() string { return s.NATSURL() }
func (s *server) httpURL() string { return s.HTTPURL() }

// startServer runs `cgledger serve` (with extra flags) until the test ends
// and waits until it is ready.
func startServer(t *testing.T, data string, natsPort, httpPort int, extra ...string) *server {
	t.Helper()
	return &server{servetest.Start(t, binary, data, natsPort, httpPort, extra...)}
}

// addrs is a server not started (yet): its ports, for a test that starts
// serve its own way or runs the CLI where nothing listens.
func addrs(natsPort, httpPort int) *server {
	return &server{&servetest.Server{Bin: binary, NATSPort: natsPort, HTTPPort: httpPort}}
}

func (s *server) kill(t *testing.T) {
	t.Helper()
	s.Kill(t)
}

// run runs a client verb against s and returns stdout and the exit code.
func (s *server) run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, _, code := s.runAll(t, args...)
	return out, code
}

// runStderr runs a client verb and returns its exit code and stderr.
func (s *server) runStderr(t *testing.T, args ...string) (int, string) {
	t.Helper()
	_, errOut, code := s.runAll(t, args...)
	return code, errOut
}

// runAll runs a client verb against s: stdout, stderr and the exit code.
func (s *server) runAll(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return s.Run(t, args...)
}

// getJSON reads url as the embedded admin (the credential serve writes).
func (s *server) getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.Data, "auth", "admin.creds"))
	require.NoError(t, err)
	tok := strings.Split(string(b), "\n")[1]
	rq, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	rq.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(rq)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	return resp.StatusCode
}
