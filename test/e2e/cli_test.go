package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/protocol"
)

// connectionFlags are the settings every client verb takes (docs/cli.md).
var connectionFlags = []string{"--nats-url", "--server", "--creds", "--nats-creds", "--nats-user", "--nats-password", "--nats-token", "--tls-ca", "--tls-cert", "--tls-key", "--json"}

// TestCLIOneGrammar: every client verb takes the same connection flags and
// shows them as --flag; sub-verbs have their own flags; help shows defaults.
func TestCLIOneGrammar(t *testing.T) {
	s := addrs(servetest.FreePort(t), servetest.FreePort(t))
	verbs := [][]string{
		{"call"}, {"tools", "register"}, {"tools", "list"}, {"tools", "pause"}, {"tools", "resume"}, {"export"}, {"verify"}, {"projector", "skip"}, {"views", "snapshot"}, {"views", "snapshots"},
		{"audit", "projects"}, {"audit", "calls"}, {"audit", "turn"}, {"audit", "call"}, {"audit", "agent"}, {"audit", "card"},
		{"calls", "cancel"}, {"calls", "resolve"}, {"mcp", "bridge"}, {"mcp", "serve"}, {"conformance"},
	}
	for _, v := range verbs {
		help, errOut, code := s.runAll(t, append(v, "--help")...)
		require.Equal(t, 0, code, "%v --help", v)
		require.Empty(t, errOut, "asked-for help goes to standard output")
		for _, f := range connectionFlags {
			require.Contains(t, help, "\n  "+f, "%v takes %s", v, f)
		}
		require.NotRegexp(t, `(?m)^  -[a-z]`, help, "%v: help spells flags --name", v)
	}
	// Each audit kind has its own flags.
	_, errOut, code := s.runAll(t, "audit", "turn", "t1", "--project", "p", "--state", "pending")
	require.Equal(t, 2, code, "audit turn takes no --state")
	require.Contains(t, errOut, "flag provided but not defined: --state", "the docs' spelling")
	// "As of 0" is not "now": sequences start at 1.
	_, errOut, code = s.runAll(t, "audit", "turn", "t1", "--project", "p", "--as-of-seq", "0")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--as-of-seq must be a ledger sequence (1 or more), got 0")
	help, _, _ := s.runAll(t, "audit", "call", "--help")
	require.Contains(t, help, "--turn")
	help, _, _ = s.runAll(t, "audit", "calls", "--help")
	for _, f := range []string{"--tool", "--agent", "--status", "--state", "--since", "--until", "--limit", "--cursor", "--all", "--as-of-seq"} {
		require.Contains(t, help, f)
	}
	help, _, _ = s.runAll(t, "serve", "--help")
	require.Contains(t, help, "(default 127.0.0.1:8080)", "serve's help shows its defaults")
	help, _, code = s.runAll(t, "version", "--help")
	require.Equal(t, 0, code)
	require.NotContains(t, help, "cgledger dev", "version --help prints help, not the version")
	require.Contains(t, help, "Usage: cgledger version")
}

// TestCLIErrorsNameTheSettingAndItsSource: an unreachable server, a bad
// setting and a missing file each say which setting (and from where) and
// exit with the documented code.
func TestCLIErrorsNameTheSettingAndItsSource(t *testing.T) {
	s := addrs(servetest.FreePort(t), servetest.FreePort(t))
	_, errOut, code := s.runAll(t, "audit", "projects")
	require.Equal(t, 3, code)
	require.Contains(t, errOut, s.httpURL())
	require.Contains(t, errOut, "CGLEDGER_SERVER", "the harness sets the server through the environment")
	_, errOut, code = s.runAll(t, "audit", "projects", "--server", "http://127.0.0.1:1")
	require.Equal(t, 3, code)
	require.Contains(t, errOut, "flag --server")
	_, errOut, code = s.runAll(t, "call", "--project", "p", "--agent", "a", "--tool", "echo")
	require.Equal(t, 3, code)
	require.Contains(t, errOut, "CGLEDGER_NATS_URL")

	_, _, code = s.runAll(t, "audit", "projects", "--creds", filepath.Join(t.TempDir(), "none.creds"))
	require.Equal(t, 2, code, "a credentials file that cannot be read is a usage error")
	_, _, code = s.runAll(t, "call", "--project", "p", "--agent", "a", "--tool", "echo", "--creds", filepath.Join(t.TempDir(), "none.creds"))
	require.Equal(t, 2, code, "the same for NATS verbs")
	out, _, code := s.runAll(t, "verify", "/etc/hostname")
	require.Equal(t, 1, code, "a file that is read and found wrong says no")
	require.Contains(t, out, "chain:      unreadable: ")
	empty := filepath.Join(t.TempDir(), "empty.jsonl")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	out, _, code = s.runAll(t, "verify", empty, "--json")
	require.Equal(t, 1, code)
	var verdict map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &verdict), "--json prints the verdict: %q", out)
	require.Equal(t, false, verdict["ok"])
	require.Contains(t, verdict["reason"], "empty file")
	for _, verb := range []string{"verify", "replay"} {
		_, errOut, code = s.runAll(t, verb, filepath.Join(t.TempDir(), "missing.jsonl"))
		require.Equal(t, 2, code, "%s of a file that does not exist is a usage error", verb)
		require.Equal(t, 1, strings.Count(errOut, verb+":"), "one prefix: %s", errOut)
	}

	cmd := exec.Command(binary, "serve", "--data", t.TempDir())
	cmd.Env = append(os.Environ(), "CGLEDGER_REPLICAS=abc")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 2, ee.ExitCode())
	require.Contains(t, stderr.String(), `"abc" from environment variable CGLEDGER_REPLICAS`)
	require.NotContains(t, stderr.String(), "strconv")

	// A value the file gives in the wrong shape is the file's, even when
	// the environment sets the value in force; an invalid value in force
	// is named by where it was set.
	shape := filepath.Join(t.TempDir(), "shape.yaml")
	require.NoError(t, os.WriteFile(shape, []byte("gc_percent: [1]\n"), 0o600))
	cmd = exec.Command(binary, "serve", "--data", t.TempDir(), "--config", shape)
	cmd.Env = append(os.Environ(), "CGLEDGER_GC_PERCENT=abc")
	stderr.Reset()
	cmd.Stderr = &stderr
	require.ErrorAs(t, cmd.Run(), &ee)
	require.Equal(t, 2, ee.ExitCode())
	lines := strings.Split(stderr.String(), "\n")
	require.Contains(t, lines, "cgledger serve: gc_percent: must be a single value, not a list, in config file "+shape, stderr.String())
	require.Contains(t, stderr.String(), `got "abc" (set by env CGLEDGER_GC_PERCENT)`)

	cfg := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("colour: blue\nflavour: mint\nreplicas: many\n"), 0o600))
	out, code = s.run(t, "check-config", "--config", cfg)
	require.Equal(t, 2, code)
	for _, k := range []string{`"colour"`, `"flavour"`, `"replicas"`} {
		require.Contains(t, out, k, "every problem is listed")
	}
}

// TestCLIAuditorVerbs: list and filter calls with paging, list projects,
// read a turn with its payloads whole and dates with their zone.
func TestCLIAuditorVerbs(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	long := strings.Repeat("abcdefghij", 30)
	for i, args := range []string{`{"text":"` + long + `"}`, `{"text":"b"}`, `{"text":"c"}`} {
		_, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", args, "--turn", "t1", "--call-id", fmt.Sprintf("c%d", i))
		require.Equal(t, 0, code)
	}
	// A call that fails: sleep refuses arguments outside its schema.
	_, code := s.run(t, "call", "--project", "demo", "--agent", "bob", "--tool", "sleep", "--args", `{"ms":"soon"}`, "--turn", "t2", "--call-id", "bad")
	require.Equal(t, 1, code)

	out, code := s.run(t, "audit", "calls", "--project", "demo")
	require.Equal(t, 0, code)
	require.Equal(t, 4, strings.Count(out, " call "), out)
	out, code = s.run(t, "audit", "calls", "--project", "demo", "--status", "failed")
	require.Equal(t, 0, code)
	require.Equal(t, 1, strings.Count(out, " call "), out)
	require.Contains(t, out, "call bad")
	out, code = s.run(t, "audit", "calls", "--project", "demo", "--agent", "alice", "--limit", "2")
	require.Equal(t, 0, code)
	require.Equal(t, 2, strings.Count(out, " call "), out)
	m := regexp.MustCompile(`next page: --cursor (\S+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	out, code = s.run(t, "audit", "calls", "--project", "demo", "--agent", "alice", "--limit", "2", "--cursor", m[1])
	require.Equal(t, 0, code)
	require.Equal(t, 1, strings.Count(out, " call "), out)
	out, code = s.run(t, "audit", "calls", "--project", "demo", "--limit", "1", "--all")
	require.Equal(t, 0, code)
	require.Equal(t, 4, strings.Count(out, " call "), "--all follows every page: %s", out)
	_, code = s.run(t, "audit", "calls", "--project", "demo", "--since", "yesterday")
	require.Equal(t, 2, code)

	var ready struct {
		AppliedSeq uint64 `json:"applied_seq"`
		LastSeq    uint64 `json:"last_seq"`
	}
	require.Equal(t, 200, s.getJSON(t, s.httpURL()+"/readyz", &ready))
	require.NotZero(t, ready.LastSeq, "/readyz says where the stream ends")
	require.GreaterOrEqual(t, ready.LastSeq, ready.AppliedSeq)

	out, code = s.run(t, "audit", "projects")
	require.Equal(t, 0, code)
	require.Contains(t, out, "demo")

	out, code = s.run(t, "audit", "turn", "t1", "--project", "demo")
	require.Equal(t, 0, code)
	require.Contains(t, out, long, "payloads are shown whole")
	require.Regexp(t, `seq \d+ +\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z `, out, "times carry the date and the zone")
	require.Contains(t, out, "\n        \"", "payloads are indented JSON")
}

// TestCLICallSaysDuplicateAndUnservedTool: a repeated call says so without
// --json; a call to a tool nobody serves warns at once and says why at the
// end.
func TestCLICallSaysDuplicateAndUnservedTool(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	args := []string{"call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{}`, "--turn", "t1", "--call-id", "c1"}
	_, errOut, code := s.runAll(t, args...)
	require.Equal(t, 0, code)
	require.NotContains(t, errOut, "dispatched before")
	_, errOut, code = s.runAll(t, args...)
	require.Equal(t, 0, code)
	require.Contains(t, errOut, "was dispatched before")

	// Nobody answers: the ledger keeps the deadline and ends the call
	// timeout itself.
	out, errOut, code := s.runAll(t, "call", "--project", "demo", "--agent", "alice", "--tool", "nobody", "--timeout", "1s")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "warning: tool nobody is not registered")
	require.Contains(t, out, "status:     timeout")
	require.Contains(t, out, protocol.TaxonomyDeadlineTimeout)
}

// TestSIGTERMFinishesCallsInFlight: a client waiting on a call when serve
// is told to stop gets its result: the executor drains, the projector
// catches up and only then do HTTP and the API stop.
func TestSIGTERMFinishesCallsInFlight(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "call", "--project", "demo", "--agent", "alice", "--tool", "sleep", "--args", `{"ms":3000}`, "--turn", "t1", "--call-id", "slow")
	cmd.Env = append(os.Environ(), "CGLEDGER_NATS_URL="+s.natsURL(), "CGLEDGER_SERVER="+s.httpURL(), "CGLEDGER_DATA="+s.Data)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Start())
	// Stop serve once the call is running (dispatched, not yet reported).
	require.Eventually(t, func() bool {
		var st struct {
			Call struct {
				State string `json:"state"`
			} `json:"call"`
		}
		return s.getJSON(t, s.httpURL()+"/v1/projects/demo/turns/t1/calls/slow", &st) == 200 && st.Call.State == "dispatched"
	}, time.Minute, 20*time.Millisecond)
	require.NoError(t, s.Cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "the waiting client gets its answer: stdout %s stderr %s", out.String(), errOut.String())
	require.Contains(t, out.String(), "status:     success")
	require.NoError(t, s.Cmd.Wait(), "serve exits 0")
	log := s.Log.String()
	require.Less(t, strings.Index(log, "executor drained"), strings.Index(log, "http server stopped"), log)
}

// TestCLIRefusedCredentialSaysSo: a credential the server refuses a publish
// to ends the verb at once (exit 1), naming the credential, instead of
// waiting out the deadline.
func TestCLIRefusedCredentialSaysSo(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	other := s.issue(t, "--project", "other", "--role", "worker", "--agent", "alice")
	_, errOut, code := s.runAll(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--creds", other.Path, "--timeout", "5m")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "may not do this")
	require.Contains(t, errOut, other.Path)
	_, errOut, code = s.runAll(t, "projector", "skip", "--seq", "1", "--reason", "x", "--creds", other.Path)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "may not do this")
}

// TestCLICallOnAWorkerCredentialBoundToTheAgent: a worker credential bound
// to --agent dispatches (the tool's definition is read as that agent too);
// the result is read over the HTTP API, which only auditors and admins may
// read, so the verb ends with forbidden after the call ran, as cli.md says.
func TestCLICallOnAWorkerCredentialBoundToTheAgent(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	worker := s.issue(t, "--project", "demo", "--role", "worker", "--agent", "alice")
	_, errOut, code := s.runAll(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"bound"}`,
		"--turn", "t-bound", "--call-id", "k-bound", "--creds", worker.Path, "--timeout", "5m")
	require.Equal(t, 1, code, errOut)
	require.NotContains(t, errOut, "may not do this", "NATS refused nothing")
	require.Contains(t, errOut, "forbidden")
	// The call was dispatched and ran: an admin's repeat of it answers with
	// the original outcome.
	out, errOut, code := s.runAll(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"bound"}`,
		"--turn", "t-bound", "--call-id", "k-bound", "--timeout", "5m")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "was dispatched before")
	require.Contains(t, out, "status:     success")
}

// TestCLIConformanceBuiltinTools: `cgledger conformance` run as CI runs it,
// with serve's admin credential against serve's built-in executor: echo
// passes every case that applies (--json, exit 0), and a tool nobody
// serves fails (exit 1) with its table.
func TestCLIConformanceBuiltinTools(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	out, errOut, code := s.runAll(t, "conformance", "--project", "demo", "--tool", "echo", "--fixture", "../../conformance/fixtures/echo.yaml", "--json")
	require.Equal(t, 0, code, "stdout %s\nstderr %s", out, errOut)
	var rep struct {
		Passed, Failed int
		Cases          []struct{ Case, Outcome, Seen string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Zero(t, rep.Failed)
	require.Equal(t, 12, rep.Passed, "%+v", rep.Cases)
	// With --json too, each case's line goes to stderr as it ends (stdout
	// is only the report).
	require.Contains(t, errOut, "cgledger conformance: normal pass (")
	// The views applied the run's malformed commands and went on: a call
	// after the run is read from them.
	_, errOut, code = s.runAll(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{}`)
	require.Equal(t, 0, code, errOut)

	quick := filepath.Join(t.TempDir(), "nobody.yaml")
	require.NoError(t, os.WriteFile(quick, []byte("timeout_ms: 1000\n"), 0o600))
	out, _, code = s.runAll(t, "conformance", "--project", "demo", "--tool", "nobody", "--fixture", quick, "--case", "normal", "--settle", "2s")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "normal")
	require.Contains(t, out, "fail")
	require.Contains(t, out, "0 passed, 1 failed")
}
