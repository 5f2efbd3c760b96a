// Package e2e runs the cgledger binary as a process, as a new user would:
// serve on free ports, call tools, register tools, audit, kill -9, restart,
// and speak the raw wire protocol with nothing but a NATS client.
package e2e

import (
	"bytes"
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

// server is a running `cgledger serve` process.
type server struct {
	cmd      *exec.Cmd
	data     string
	natsPort int
	httpPort int
	log      *servetest.LogBuffer
}

func (s *server) natsURL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.natsPort) }
func (s *server) httpURL() string { return fmt.Sprintf("http://127.0.0.1:%d", s.httpPort) }

// startServer runs `cgledger serve` (with extra flags) until the test ends
// and waits until it is ready.
func startServer(t *testing.T, data string, natsPort, httpPort int, extra ...string) *server {
	t.Helper()
	s := &server{data: data, natsPort: natsPort, httpPort: httpPort, log: &servetest.LogBuffer{}}
	s.cmd = exec.Command(binary, append([]string{"serve", "--data", data,
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", natsPort), "--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--log-format", "json"}, extra...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, s.cmd.Start())
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			_ = s.cmd.Process.Kill()
			_ = s.cmd.Wait()
		}
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
	}, 60*time.Second, 50*time.Millisecond, "serve becomes ready")
	return s
}

func (s *server) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGKILL))
	_ = s.cmd.Wait()
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), "CGLEDGER_NATS_URL="+s.natsURL(), "CGLEDGER_SERVER="+s.httpURL())
	if s.data != "" {
		// The CLI finds serve's admin credential under CGLEDGER_DATA.
		cmd.Env = append(cmd.Env, "CGLEDGER_DATA="+s.data)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	if code != 0 {
		t.Logf("cgledger %s: exit %d, stderr: %s", strings.Join(args, " "), code, errOut.String())
	}
	return out.String(), errOut.String(), code
}

// getJSON reads url as the embedded admin (the credential serve writes).
func (s *server) getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.data, "auth", "admin.creds"))
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
