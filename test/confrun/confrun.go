// Package confrun runs `cgledger conformance` as CI does (docs/conformance.md, "In CI"): a
// `cgledger serve` of the binary built from this tree on free loopback ports with
// authentication on, tool services as child processes with credentials issued by the CLI, and
// the checker run by the binary with --json, its report read back. The tests of test/sdkts (the
// TypeScript SDK's example tool service) and test/conformanceci (the MCP bridge and the built-in
// executor) use it.
package confrun

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/conformance"
	"github.com/cgledger/cgledger/internal/servetest"
)

// Serve is a running `cgledger serve`.
type Serve struct {
	Bin, Data, NATSURL, HTTPURL string
	Log                         *servetest.LogBuffer
}

// StartServe runs `bin serve` with extra flags (roles, ack waits...) until the test ends, and
// waits until /readyz answers 200.
func StartServe(t *testing.T, bin string, extra ...string) *Serve {
	t.Helper()
	dir := t.TempDir()
	natsPort, httpPort := servetest.FreePort(t), servetest.FreePort(t)
	s := &Serve{Bin: bin, Data: filepath.Join(dir, "data"), NATSURL: fmt.Sprintf("nats://127.0.0.1:%d", natsPort),
		HTTPURL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), Log: &servetest.LogBuffer{}}
	args := append([]string{"serve", "--data", s.Data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", natsPort),
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--log-format", "json"}, extra...)
	cmd := exec.Command(bin, args...)
	// Only what this serve is told: a CGLEDGER_NATS_URL of the caller's would make it use that
	// server instead of its own.
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = s.Log, s.Log
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("serve log:\n%s", s.Log)
		}
	})
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return false
		default:
		}
		resp, err := http.Get(s.HTTPURL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 50*time.Millisecond, "serve ready; log:\n%s", s.Log)
	return s
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CGLEDGER_") {
			env = append(env, kv)
		}
	}
	return env
}

// Env is the environment of a client verb of this serve, with serve's admin credential (under
// CGLEDGER_DATA).
func (s *Serve) Env() []string {
	return append(cleanEnv(), "CGLEDGER_DATA="+s.Data, "CGLEDGER_NATS_URL="+s.NATSURL, "CGLEDGER_SERVER="+s.HTTPURL)
}

// CLI runs a client verb of the binary and returns its standard output; it fails the test on a
// non-zero exit.
func (s *Serve) CLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := s.run(args...)
	require.Equal(t, 0, code, "cgledger %s:\nstdout %s\nstderr %s", strings.Join(args, " "), out, errOut)
	return out
}

func (s *Serve) run(args ...string) (string, string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.Bin, args...)
	cmd.Env = s.Env()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errOut.String(), ee.ExitCode()
	case err != nil:
		return out.String(), err.Error(), -1
	}
	return out.String(), errOut.String(), 0
}

// Creds issues a credential with `creds issue` and writes it to a file of the test's: its path.
func (s *Serve) Creds(t *testing.T, project, role string, flags ...string) string {
	t.Helper()
	out := s.CLI(t, append([]string{"creds", "issue", "--project", project, "--role", role, "--json"}, flags...)...)
	var c struct {
		Creds string `json:"creds"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &c), out)
	f := filepath.Join(t.TempDir(), project+"-"+role+".creds")
	require.NoError(t, os.WriteFile(f, []byte(c.Creds), 0o600))
	return f
}

// Proc is a child process of the test (a tool service).
type Proc struct {
	Log *servetest.LogBuffer
}

// StartProc runs argv in dir with env until the test ends (SIGTERM, then SIGKILL after a
// minute), and waits until its output holds ready.
func StartProc(t *testing.T, dir string, env []string, ready string, argv ...string) *Proc {
	t.Helper()
	p := &Proc{Log: &servetest.LogBuffer{}}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", filepath.Base(argv[len(argv)-1]), p.Log)
		}
	})
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return false
		default:
		}
		return strings.Contains(p.Log.String(), ready)
	}, time.Minute, 20*time.Millisecond, "%q in the output of %v:\n%s", ready, argv, p.Log)
	return p
}

// Conformance runs `cgledger conformance --project project --tool tool --fixture fixture --json`
// as CI does, requires exit 0 (no case failed) and returns the report, logging its table.
func (s *Serve) Conformance(t *testing.T, project, tool, fixture string) conformance.Report {
	t.Helper()
	start := time.Now()
	out, errOut, code := s.run("conformance", "--project", project, "--tool", tool, "--fixture", fixture, "--json")
	var rep conformance.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "stdout %s\nstderr %s", out, errOut)
	t.Logf("cgledger conformance --tool %s --fixture %s (%s):\n%s", tool, filepath.Base(fixture), time.Since(start).Round(time.Millisecond), Table(rep))
	require.Equal(t, 0, code, "exit code; stderr %s", errOut)
	require.Zero(t, rep.Failed)
	return rep
}

// Table is the report as the verb prints it without --json.
func Table(rep conformance.Report) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tOUTCOME\tSEEN")
	for _, c := range rep.Cases {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Case, c.Outcome, c.Seen)
	}
	_ = tw.Flush()
	fmt.Fprintf(&b, "run %s: %d passed, %d failed, %d not applicable\n", rep.Run, rep.Passed, rep.Failed, rep.NotApplicable)
	return b.String()
}

// RequireApplies requires exactly the cases pass to have passed and every other case to be
// not_applicable: a case that stops applying (a fixture or a setting lost) fails as surely as
// one that fails. A case of racy may also be not_applicable: side_effect_reconcile is, when the
// service wins the race for the attempt five times (docs/conformance.md).
func RequireApplies(t *testing.T, rep conformance.Report, pass []string, racy ...string) {
	t.Helper()
	var passed, other []string
	for _, c := range rep.Cases {
		switch {
		case c.Outcome == conformance.Pass:
			passed = append(passed, c.Case)
		case c.Outcome == conformance.NotApplicable && slices.Contains(racy, c.Case):
			t.Logf("%s not applicable this time: %s", c.Case, c.Seen)
			passed = append(passed, c.Case)
		case c.Outcome != conformance.NotApplicable:
			other = append(other, c.Case+" "+string(c.Outcome))
		}
	}
	slices.Sort(passed)
	want := append(slices.Clone(pass), racy...)
	slices.Sort(want)
	require.Empty(t, other)
	require.Equal(t, want, passed, "the cases that apply and pass")
	require.Equal(t, 22, len(rep.Cases), "every case reported")
}
