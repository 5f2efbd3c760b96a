// Package confrun runs `cgledger conformance` as CI does (docs/conformance.md, "In CI"): a
// `cgledger serve` of the binary built from this tree on free loopback ports with
// authentication on, tool services as child processes with credentials issued by the CLI, and
// the checker run by the binary with --json, its report read back. The tests of test/sdkts (the
// TypeScript SDK's example tool service) and test/conformanceci (the MCP bridge and the built-in
// executor) use it.
package confrun

import (
	"encoding/json"
	"fmt"
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

// Serve is a running `cgledger serve` (internal/servetest's), and the CLI run against it.
type Serve struct {
	*servetest.Server
}

// StartServe runs `bin serve` with extra flags (roles, ack waits...) on free loopback ports and
// a data directory of the test's, until the test ends, and waits until it is ready.
func StartServe(t *testing.T, bin string, extra ...string) *Serve {
	t.Helper()
	return &Serve{servetest.Start(t, bin, filepath.Join(t.TempDir(), "data"), servetest.FreePort(t), servetest.FreePort(t), extra...)}
}

// CLI runs a client verb of the binary and returns its standard output; it fails the test on a
// non-zero exit.
func (s *Serve) CLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := s.Run(t, args...)
	require.Equal(t, 0, code, "cgledger %s:\nstdout %s\nstderr %s", strings.Join(args, " "), out, errOut)
	return out
}

// Creds issues a credential with `creds issue` (project, role, flags such as --tool T): the
// path of its file.
func (s *Serve) Creds(t *testing.T, project, role string, flags ...string) string {
	t.Helper()
	return s.Issue(t, append([]string{"--project", project, "--role", role}, flags...)...).Path
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
	out, errOut, code := s.Run(t, "conformance", "--project", project, "--tool", tool, "--fixture", fixture, "--json")
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
