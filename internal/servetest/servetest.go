// Package servetest runs the cgledger binary for tests that treat it as a
// process (end-to-end tests, the OpenAPI check against a real server), as
// net/http/httptest serves handlers: it builds the binary, finds free
// loopback ports, collects a child process's log, and runs `cgledger serve`
// (Server) with the CLI against it.
package servetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build compiles cmd/cgledger from this tree into dir and returns the
// binary's path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "cgledger")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/cgledger/cgledger/cmd/cgledger").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build cgledger: %v: %s", err, out)
	}
	return bin, nil
}

// FreePort returns a loopback TCP port nothing listens on now.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("servetest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// LogBuffer is a child process's log: its output copier writes while the
// test reads.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Server is a `cgledger serve` process on loopback ports, and the CLI run
// against it (CGLEDGER_NATS_URL, CGLEDGER_SERVER and CGLEDGER_DATA set).
// A Server with no Cmd is only addresses: a test that starts serve its own
// way, or runs the CLI where nothing listens.
type Server struct {
	// Bin is the cgledger binary (Build).
	Bin string
	// Cmd is the serve process, once started.
	Cmd *exec.Cmd
	// Data is serve's data directory; "" when it has none the CLI needs.
	Data     string
	NATSPort int
	HTTPPort int
	// Log is serve's standard output and error.
	Log *LogBuffer
}

// NATSURL is the server's NATS listener.
func (s *Server) NATSURL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.NATSPort) }

// HTTPURL is the server's HTTP listener.
func (s *Server) HTTPURL() string { return fmt.Sprintf("http://127.0.0.1:%d", s.HTTPPort) }

// Start runs `bin serve` on data and the two ports (with extra flags) until
// the test ends, when it is killed unless it exited already, and waits
// until it is ready (GET /readyz is 200). Its log is shown when the test
// failed.
func Start(tb testing.TB, bin, data string, natsPort, httpPort int, extra ...string) *Server {
	tb.Helper()
	s := &Server{Bin: bin, Data: data, NATSPort: natsPort, HTTPPort: httpPort, Log: &LogBuffer{}}
	s.Cmd = exec.Command(bin, append([]string{"serve", "--data", data,
		"--nats-listen", fmt.Sprintf("127.0.0.1:%d", natsPort), "--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--log-format", "json"}, extra...)...)
	s.Cmd.Stdout, s.Cmd.Stderr = s.Log, s.Log
	if err := s.Cmd.Start(); err != nil {
		tb.Fatalf("servetest: start serve: %v", err)
	}
	tb.Cleanup(func() {
		if s.Cmd.ProcessState == nil {
			if tb.Failed() {
				DumpGoroutines(s.Cmd)
			}
			_ = s.Cmd.Process.Kill()
			_ = s.Cmd.Wait()
		}
		if tb.Failed() {
			tb.Logf("serve log:\n%s", s.Log.String())
		}
	})
	ready := func() bool {
		resp, err := http.Get(s.HTTPURL() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(time.Minute)
	for !ready() {
		select {
		case <-limit:
			tb.Fatalf("servetest: serve not ready within a minute; log:\n%s", s.Log.String())
		case <-tick.C:
		}
	}
	return s
}

// DumpGoroutines asks a serve still running after a failed test for its
// goroutines (SIGQUIT: the Go runtime writes every stack to standard error,
// into the log, and exits), so a hang leaves its cause. It waits at most
// dumpWait for the process to exit.
func DumpGoroutines(cmd *exec.Cmd) {
	if cmd.Process.Signal(syscall.SIGQUIT) != nil {
		return
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(dumpWait):
		_ = cmd.Process.Kill()
		<-done
	}
}

// dumpWait bounds how long a SIGQUIT's dump may take.
const dumpWait = 10 * time.Second

// Kill kills serve (SIGKILL, as a crash) and waits for it to exit.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	if err := s.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		tb.Fatalf("servetest: kill serve: %v", err)
	}
	_ = s.Cmd.Wait()
}

// Env is the environment of a CLI run against s.
func (s *Server) Env() []string {
	env := append(os.Environ(), "CGLEDGER_NATS_URL="+s.NATSURL(), "CGLEDGER_SERVER="+s.HTTPURL())
	if s.Data != "" {
		// The CLI finds serve's admin credential under CGLEDGER_DATA.
		env = append(env, "CGLEDGER_DATA="+s.Data)
	}
	return env
}

// Run runs a client verb of the binary against s (within two minutes):
// stdout, stderr and the exit code. A failing exit is logged with its
// stderr.
func (s *Server) Run(tb testing.TB, args ...string) (stdout, stderr string, code int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Bin, args...)
	cmd.Env = s.Env()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		tb.Fatalf("servetest: run cgledger %s: %v", strings.Join(args, " "), err)
	}
	if code != 0 {
		tb.Logf("cgledger %s: exit %d, stderr: %s", strings.Join(args, " "), code, errOut.String())
	}
	return out.String(), errOut.String(), code
}

// Credential is what `cgledger creds issue --json` prints, and the file it
// wrote.
type Credential struct {
	Creds       string `json:"creds"`
	JWT         string `json:"jwt"`
	InboxPrefix string `json:"inbox_prefix"`
	// Path is the .creds file.
	Path string `json:"-"`
}

// Issue runs `cgledger creds issue` (with args: project, role, agent…)
// against s's data directory and checks that the file it wrote is the
// credential it printed.
func (s *Server) Issue(tb testing.TB, args ...string) Credential {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "user.creds")
	out, errOut, code := s.Run(tb, append([]string{"creds", "issue", "--json", "--out", path}, args...)...)
	if code != 0 {
		tb.Fatalf("servetest: creds issue %v: exit %d: %s", args, code, errOut)
	}
	var c Credential
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		tb.Fatalf("servetest: creds issue printed %q: %v", out, err)
	}
	written, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("servetest: --out writes the file alongside --json: %v", err)
	}
	if string(written) != c.Creds {
		tb.Fatalf("servetest: creds issue wrote a file other than the credential it printed")
	}
	c.Path = path
	return c
}
