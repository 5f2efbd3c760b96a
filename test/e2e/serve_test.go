package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/protocol"
	ledgerstream "github.com/cgledger/cgledger/stream"
)

type callJSON struct {
	Identity map[string]any `json:"identity"`
	Report   struct {
		State       string `json:"state"`
		Status      string `json:"status"`
		ReportedSeq uint64 `json:"reported_seq"`
		Duplicates  int    `json:"duplicates"`
	} `json:"report"`
	ResultCard struct {
		Card struct {
			Content struct {
				Status string          `json:"status"`
				Result json.RawMessage `json:"result"`
			} `json:"content"`
		} `json:"card"`
	} `json:"result_card"`
}

func TestServeCallAuditKillRestart(t *testing.T) {
	data := t.TempDir()
	np, hp := servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, np, hp)

	out, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"hi"}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 0, code)
	require.Contains(t, out, "status:     success")
	require.Contains(t, out, `{"text":"hi"}`)
	// Calls are keyed by (project, turn, call): the same call id in another
	// turn is another call with its own card, not a conflict.
	out, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"again"}`, "--turn", "t0", "--call-id", "c1")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `{"text":"again"}`)

	// Flags after the positional argument work too; --json is parseable.
	out, code = s.run(t, "call", "--json", "--project", "demo", "--agent", "alice", "--tool", "sleep", "--args", `{"ms":5000}`, "--timeout", "300ms", "--turn", "t1", "--call-id", "c2")
	require.Equal(t, 1, code, "a timeout is not success")
	var cj callJSON
	require.NoError(t, json.Unmarshal([]byte(out), &cj), out)
	require.Equal(t, "timeout", cj.Report.Status)

	def := filepath.Join(t.TempDir(), "shout.yaml")
	require.NoError(t, os.WriteFile(def, []byte("tool_name: shout\nparameters: {type: object, properties: {text: {type: string}}, required: [text]}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo\nafter_execution: terminate\noptions: {args: {fixed: {loud: true}}}\n"), 0o600))
	out, code = s.run(t, "tools", "register", def, "--project", "demo")
	require.Equal(t, 0, code)
	require.Contains(t, out, "registered shout")
	out, code = s.run(t, "tools", "list", "--project", "demo")
	require.Equal(t, 0, code)
	require.Contains(t, out, "shout")
	require.Contains(t, out, "built-in")
	out, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "shout", "--args", `{"text":"x"}`, "--turn", "t1", "--call-id", "c3", "--json")
	require.Equal(t, 0, code)
	cj = callJSON{}
	require.NoError(t, json.Unmarshal([]byte(out), &cj))
	require.JSONEq(t, `{"text":"x","loud":true}`, string(cj.ResultCard.Card.Content.Result))
	_, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "shout", "--args", `{}`, "--turn", "t1", "--call-id", "c4")
	require.Equal(t, 1, code, "schema violation -> failed")

	out, code = s.run(t, "audit", "turn", "t1", "--project", "demo")
	require.Equal(t, 0, code)
	require.Contains(t, out, "turn t1 in project demo")
	require.Equal(t, 4, strings.Count(out, " report "), out)
	var tl struct {
		Items []struct {
			Kind string `json:"kind"`
		} `json:"items"`
	}
	require.Equal(t, 200, s.getJSON(t, s.httpURL()+"/v1/projects/demo/turns/t1/timeline", &tl))
	out, code = s.run(t, "audit", "call", "c1", "--project", "demo", "--json")
	require.Equal(t, 0, code)
	require.Contains(t, out, `"state":"reported"`)
	_, code = s.run(t, "audit", "card", "nope", "--project", "demo")
	require.Equal(t, 1, code)

	// kill -9 and restart on the same data: nothing acknowledged is lost.
	s.kill(t)
	s = startServer(t, data, np, hp)
	var tl2 struct {
		Items []struct {
			Kind string `json:"kind"`
		} `json:"items"`
	}
	require.Equal(t, 200, s.getJSON(t, s.httpURL()+"/v1/projects/demo/turns/t1/timeline", &tl2))
	require.Equal(t, len(tl.Items), len(tl2.Items), "the views came back with every entry")

	// Repeating a call on purpose returns the original outcome, not a second report.
	out, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"hi"}`, "--turn", "t1", "--call-id", "c1", "--json")
	require.Equal(t, 0, code)
	cj = callJSON{}
	require.NoError(t, json.Unmarshal([]byte(out), &cj))
	require.Equal(t, true, cj.Identity["duplicate_dispatch"])

	// A new call works after the restart, and the ledger holds exactly one
	// report per call.
	_, code = s.run(t, "call", "--project", "demo", "--agent", "bob", "--tool", "echo", "--args", `{}`, "--turn", "t2", "--call-id", "c5")
	require.Equal(t, 0, code)
	export := filepath.Join(t.TempDir(), "ledger.jsonl")
	out, code = s.run(t, "export", "--out", export)
	require.Equal(t, 0, code, out)
	raw, err := os.ReadFile(export)
	require.NoError(t, err)
	reports := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var e struct {
			Subject string              `json:"subject"`
			Headers map[string][]string `json:"headers"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &e))
		if kind := e.Headers["CG-Entry-Kind"]; len(kind) == 1 && kind[0] == "report" {
			reports[e.Subject]++
		}
	}
	require.Len(t, reports, 6)
	for subj, n := range reports {
		require.Equal(t, 1, n, subj)
	}

	out, code = s.run(t, "verify", "--json")
	require.Equal(t, 0, code)
	var live map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &live))
	require.Equal(t, true, live["ok"])
	out, code = s.run(t, "replay", export, "--json", "--expect", live["digest"].(string))
	require.Equal(t, 0, code, "the replayed views equal the live server's: %s", out)
	out, errOut, code := s.runAll(t, "verify", export)
	require.Equal(t, 0, code)
	require.Contains(t, out, "chain:      OK")
	// The last progress line says where the operation ended, even when it
	// ended between two of the rate-limited lines.
	entries := len(strings.Split(strings.TrimSpace(string(raw)), "\n")) - 2
	progress := strings.Split(strings.TrimSpace(errOut), "\n")
	require.Contains(t, progress[len(progress)-1], fmt.Sprintf("verify: %d entries imported and verified, %d projected", entries, entries), errOut)

	// An edited export fails verification at the edited entry.
	edited := strings.Replace(string(raw), `"CG-Agent-Id":["bob"]`, `"CG-Agent-Id":["mallory"]`, 1)
	require.NotEqual(t, string(raw), edited)
	bad := filepath.Join(t.TempDir(), "edited.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(edited), 0o600))
	out, code = s.run(t, "verify", bad)
	require.Equal(t, 1, code)
	require.Contains(t, out, "BROKEN at seq")

	// The same edit with every link recomputed is consistent alone, but its
	// head differs from the live chain's link at its last sequence.
	forged := filepath.Join(t.TempDir(), "forged.jsonl")
	require.NoError(t, os.WriteFile(forged, relink(t, []byte(edited)), 0o600))
	out, code = s.run(t, "verify", forged, "--against", s.httpURL())
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "live:       DIFFERS")
	out, code = s.run(t, "verify", export, "--against", s.httpURL(), "--json")
	require.Equal(t, 0, code, out)
	var vj map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &vj))
	require.Equal(t, "matches", vj["live"])
	// Without --against the default server (CGLEDGER_SERVER here) is used.
	out, code = s.run(t, "verify", forged)
	require.Equal(t, 1, code, out)
	// A file that claims entries past the live ledger's end differs too.
	extended := filepath.Join(t.TempDir(), "extended.jsonl")
	require.NoError(t, os.WriteFile(extended, relink(t, appendCopyOfLast(t, raw)), 0o600))
	out, code = s.run(t, "verify", extended)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "live:       DIFFERS")
	// A faithful prefix (the last entries cut, the trailer rewritten so that
	// the file verifies on its own) is not tampering, but it is not the live
	// ledger either: it says so, with where each ends.
	var trailer ledgerstream.ExportTrailer
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &trailer))
	cut := append(lines[:len(lines)-3:len(lines)-3], lines[len(lines)-1])
	truncated := filepath.Join(t.TempDir(), "truncated.jsonl")
	require.NoError(t, os.WriteFile(truncated, relink(t, []byte(strings.Join(cut, "\n")+"\n")), 0o600))
	out, code = s.run(t, "verify", truncated, "--against", s.httpURL(), "--json")
	require.Equal(t, 0, code, out)
	vj = nil
	require.NoError(t, json.Unmarshal([]byte(out), &vj))
	require.Equal(t, true, vj["ok"], out)
	require.Equal(t, "prefix of the live ledger", vj["live"], out)
	require.EqualValues(t, trailer.LastSeq-2, vj["last_seq"], out)
	require.EqualValues(t, trailer.LastSeq, vj["live_last_seq"], out)
	out, code = s.run(t, "verify", truncated, "--against", s.httpURL())
	require.Equal(t, 0, code, out)
	require.Contains(t, out, fmt.Sprintf("last_seq:   %d\n", trailer.LastSeq-2))
	require.Contains(t, out, "live:       prefix of the live ledger\n")
	require.Contains(t, out, fmt.Sprintf("live_last_seq: %d\n", trailer.LastSeq))
	require.NotContains(t, out, "matches")
	// The whole export still matches, and says nothing of a prefix.
	out, code = s.run(t, "verify", export, "--against", s.httpURL())
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "live:       matches\n")
	require.NotContains(t, out, "live_last_seq")
	// An unreachable --against is an error, not a silent pass.
	_, code = s.run(t, "verify", export, "--against", fmt.Sprintf("http://127.0.0.1:%d", servetest.FreePort(t)))
	require.Equal(t, 3, code)
	// A credential the server refuses gives no verdict on the file: the
	// refusal, naming the credential and where it came from.
	worker := s.issue(t, "--project", "demo", "--role", "worker", "--agent", "alice")
	out, errOut, code = s.runAll(t, "verify", export, "--against", s.httpURL(), "--creds", worker.Path)
	require.Equal(t, 1, code, out+errOut)
	require.NotContains(t, out+errOut, "DIFFERS")
	require.NotContains(t, out+errOut, "holds entries the ledger does not")
	require.Contains(t, errOut, "refused")
	require.Contains(t, errOut, "(from flag --creds)")
	// A serve without the views (no projector role) holds no chain links:
	// no verdict on the file (found from outside: it said DIFFERS).
	noViews := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t), "--no-auth", "--roles", "api,executor")
	out, errOut, code = s.runAll(t, "verify", export, "--against", noViews.httpURL())
	require.Equal(t, 3, code, out+errOut)
	require.NotContains(t, out+errOut, "DIFFERS")
	require.Contains(t, errOut, "does not serve the chain links")
}

// appendCopyOfLast adds a copy of an export's last entry at the next
// sequence (links left for relink to fix).
func appendCopyOfLast(t *testing.T, raw []byte) []byte {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	var e ledgerstream.ExportEntry
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-2]), &e))
	e.Seq++
	b, err := json.Marshal(e)
	require.NoError(t, err)
	out := append(append(lines[:len(lines)-1:len(lines)-1], string(b)), lines[len(lines)-1])
	return []byte(strings.Join(out, "\n") + "\n")
}

// relink recomputes every chain link of an export (and its trailer's head),
// as a forger who edited entries would.
func relink(t *testing.T, raw []byte) []byte {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	var hdr ledgerstream.ExportHeader
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &hdr))
	prev, err := protocol.ParseLink(hdr.PrevLink)
	require.NoError(t, err)
	out := []string{lines[0]}
	for _, line := range lines[1 : len(lines)-1] {
		var e ledgerstream.ExportEntry
		require.NoError(t, json.Unmarshal([]byte(line), &e))
		prev = protocol.NextLink(prev, e.Seq, e.Subject, nats.Header(e.Headers), e.Data)
		e.Link = prev.String()
		b, err := json.Marshal(e)
		require.NoError(t, err)
		out = append(out, string(b))
	}
	var tr ledgerstream.ExportTrailer
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &tr))
	tr.Head = prev.String()
	tr.Count = uint64(len(out) - 1)
	var last ledgerstream.ExportEntry
	require.NoError(t, json.Unmarshal([]byte(out[len(out)-1]), &last))
	tr.LastSeq = last.Seq
	b, err := json.Marshal(tr)
	require.NoError(t, err)
	out = append(out, string(b))
	return []byte(strings.Join(out, "\n") + "\n")
}

func TestCLIUsageAndConfig(t *testing.T) {
	s := addrs(servetest.FreePort(t), servetest.FreePort(t))
	_, code := s.run(t, "nonsense")
	require.Equal(t, 2, code)
	out, code := s.run(t, "version")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, "cgledger "))
	_, code = s.run(t, "call", "--project", "p")
	require.Equal(t, 2, code, "missing required flags")
	_, code = s.run(t, "call", "--project", "p", "--agent", "a", "--tool", "echo")
	require.Equal(t, 3, code, "no server to reach")

	cfg := filepath.Join(t.TempDir(), "cgledger.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("data: /srv/cg\nhttp_listen: 127.0.0.1:9999\nlog_format: json\nroles: [api, projector]\nnats_password: hunter22\n"), 0o600))
	t.Setenv("CGLEDGER_HTTP_LISTEN", "127.0.0.1:7777")
	out, code = s.run(t, "check-config", "--config", cfg, "--log-format", "text")
	require.Equal(t, 0, code, out)
	var cc struct {
		Valid    bool `json:"valid"`
		Settings map[string]struct {
			Value  string `json:"value"`
			Source string `json:"source"`
		} `json:"settings"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &cc))
	require.True(t, cc.Valid)
	require.Equal(t, "/srv/cg", cc.Settings["data"].Value)
	require.Contains(t, cc.Settings["data"].Source, "file")
	require.Equal(t, "127.0.0.1:7777", cc.Settings["http_listen"].Value, "env beats file")
	require.Equal(t, "text", cc.Settings["log_format"].Value, "flag beats file")
	require.Equal(t, "api,projector", cc.Settings["roles"].Value)
	require.Equal(t, "********", cc.Settings["nats_password"].Value)
	require.NotContains(t, out, "hunter22")

	out, code = s.run(t, "check-config", "--replicas", "3", "--log-level", "loud", "--roles", "api,cook")
	require.Equal(t, 2, code)
	require.Contains(t, out, `"replicas"`)
	require.Contains(t, out, `"log_level"`)
	require.Contains(t, out, `"roles"`)
}

func TestSIGTERMShutsDownGracefully(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	_, code := s.run(t, "call", "--project", "demo", "--agent", "a", "--tool", "echo", "--args", `{}`)
	require.Equal(t, 0, code)
	require.NoError(t, s.Cmd.Process.Signal(syscall.SIGTERM))
	err := s.Cmd.Wait()
	require.NoError(t, err, "exit code 0 after a graceful shutdown")
	log := s.Log.String()
	for _, step := range []string{"shutting down", "executor drained", "projector stopped", "embedded nats-server stopped"} {
		require.Contains(t, log, step)
	}
	require.Less(t, strings.Index(log, "executor drained"), strings.Index(log, "projector stopped"))
	require.Less(t, strings.Index(log, "projector stopped"), strings.Index(log, "embedded nats-server stopped"))
}

// TestServeLogsItsMemoryLimit: the default memory_limit (auto) is logged
// with the value it took and why; a size is logged as set; GOMEMLIMIT wins;
// off is logged as no limit. The collector's target is logged beside it,
// with where it came from.
func TestServeLogsItsMemoryLimit(t *testing.T) {
	line := func(log, msg string) map[string]any {
		for _, line := range strings.Split(log, "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && fmt.Sprint(m["msg"]) == msg {
				return m
			}
		}
		require.Fail(t, "no "+msg+" line", log)
		return nil
	}
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	m := line(s.Log.String(), "memory limit")
	require.Contains(t, m["from"], "auto")
	require.GreaterOrEqual(t, m["mib"], float64(1024), "auto is at least 1 GiB")
	gc := line(s.Log.String(), "gc percent")
	require.Equal(t, "400", gc["value"], "gc_percent's default")
	require.Equal(t, "gc_percent", gc["from"])
	s.kill(t)

	s = startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t), "--memory-limit", "3GiB", "--gc-percent", "")
	m = line(s.Log.String(), "memory limit")
	require.Equal(t, float64(3072), m["mib"])
	require.Equal(t, "memory_limit", m["from"])
	gc = line(s.Log.String(), "gc percent")
	require.Equal(t, "100", gc["value"])
	require.Contains(t, gc["from"], "Go runtime")
	s.kill(t)

	t.Setenv("GOMEMLIMIT", "2GiB")
	t.Setenv("GOGC", "250")
	s = startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t), "--memory-limit", "3GiB")
	m = line(s.Log.String(), "memory limit")
	require.Equal(t, "GOMEMLIMIT in the environment", m["from"])
	require.Equal(t, float64(2048), m["mib"])
	gc = line(s.Log.String(), "gc percent")
	require.Equal(t, "250", gc["value"])
	require.Equal(t, "GOGC in the environment", gc["from"])
	s.kill(t)

	t.Setenv("GOMEMLIMIT", "off")
	t.Setenv("GOGC", "")
	s = startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t), "--memory-limit", "3GiB")
	m = line(s.Log.String(), "memory limit")
	require.Equal(t, float64(0), m["mib"], "GOMEMLIMIT=off: no limit, logged as 0")
	require.Equal(t, "GOMEMLIMIT in the environment: off, no limit", m["from"])
	s.kill(t)

	t.Setenv("GOMEMLIMIT", "")
	s = startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t), "--memory-limit", "off")
	m = line(s.Log.String(), "memory limit")
	require.Equal(t, float64(0), m["mib"], "no limit")
	require.Contains(t, m["from"], "off")
}

// TestBenchRunsAndReportsRatios: `cgledger bench` measures both sides in one
// run and prints ratios (a smoke test: the figures belong in BENCHMARKS.md,
// not in assertions). The whole-call workloads are compared with two
// baselines: the raw round trip, whose results are pipelined rather than
// published one at a time, and the protocol's own limit; the MCP front
// door's with a direct MCP call.
func TestBenchRunsAndReportsRatios(t *testing.T) {
	s := addrs(servetest.FreePort(t), servetest.FreePort(t))
	out, code := s.run(t, "bench", "--duration", "300ms", "--rounds", "1", "--inflight", "64", "--json")
	require.Equal(t, 0, code, out)
	type result struct {
		Calls           int     `json:"calls"`
		PerSecond       float64 `json:"per_second"`
		LedgerMsgs      float64 `json:"ledger_msgs_per_call"`
		ResultsInFlight int     `json:"max_results_in_flight"`
	}
	var res struct {
		Rows []struct {
			Workload   string  `json:"workload"`
			Ratio      float64 `json:"ratio_per_second"`
			LimitRatio float64 `json:"ratio_protocol_limit"`
			CgLedger   result  `json:"cgledger"`
			Raw        result  `json:"raw"`
			Limit      *result `json:"protocol_limit"`
		} `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	var workloads []string
	for _, r := range res.Rows {
		workloads = append(workloads, r.Workload)
	}
	// mcp echo: a tools/call through serve's /mcp against a direct one of
	// an echo MCP server, in the same run.
	// floor: the messages of an e2e external call on raw JetStream alone,
	// beside the same baselines.
	require.Equal(t, []string{"floor", "e2e echo", "e2e echo se", "e2e external", "mcp echo", "report", "duplicate report"}, workloads)
	for _, r := range res.Rows {
		require.Positive(t, r.CgLedger.Calls, r.Workload)
		require.Positive(t, r.Raw.Calls, r.Workload)
		require.Positive(t, r.Ratio, r.Workload)
		require.InDelta(t, r.CgLedger.PerSecond/r.Raw.PerSecond, r.Ratio, 1e-9, r.Workload)
		if r.Workload == "floor" {
			// Its ledger side sends, before each call returns, the four
			// replies, the card, the call key, the command, the card's
			// direct get, the result card, the report, the wakeup and the
			// consumed entry; the keeper's hand-back and ack come after.
			require.GreaterOrEqual(t, r.CgLedger.LedgerMsgs, 12.0, "the floor's messages per call")
		}
		if !strings.HasPrefix(r.Workload, "e2e ") && r.Workload != "floor" {
			require.Nil(t, r.Limit, "%s is not a whole call: no protocol limit", r.Workload)
			continue
		}
		require.NotNil(t, r.Limit, r.Workload)
		require.Positive(t, r.Limit.Calls, r.Workload)
		require.Positive(t, r.LimitRatio, r.Workload)
		require.InDelta(t, r.CgLedger.PerSecond/r.Limit.PerSecond, r.LimitRatio, 1e-9, r.Workload)
		// 64 callers at once: a baseline that publishes each result only
		// after the last one's ack never has two in flight.
		require.Greater(t, r.Raw.ResultsInFlight, 1, "the raw round trip's results are pipelined")
	}
	// The text form prints the ratios; --workloads measures only those named.
	out, code = s.run(t, "bench", "--duration", "100ms", "--rounds", "1", "--inflight", "2", "--workloads", "echo,report")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "limit/s")
	require.Contains(t, out, "ratio lim")
	require.Contains(t, out, "cpu x lim")
	require.Contains(t, out, "e2e echo")
	require.Contains(t, out, "report ")
	require.NotContains(t, out, "mcp echo")
	require.NotContains(t, out, "e2e external")
	require.NotContains(t, out, "floor ")
}

// TestBenchRebuildMeasuresEachAgainstItsFloor: bench --rebuild prints the
// rebuild and the replay against their floors, and the time to ready of a
// fresh replica from a snapshot against the full rebuild; the bench itself
// fails when any of them ends with other views than the rebuild's.
func TestBenchRebuildMeasuresEachAgainstItsFloor(t *testing.T) {
	s := addrs(servetest.FreePort(t), servetest.FreePort(t))
	out, code := s.run(t, "bench", "--rebuild", "200", "--rounds", "1", "--json")
	require.Equal(t, 0, code, out)
	var res struct {
		Rows []struct {
			Workload string              `json:"workload"`
			Floor    *struct{}           `json:"floor"`
			Ratio    float64             `json:"ratio_floor"`
			CgLedger struct{ Calls int } `json:"cgledger"`
		} `json:"rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Len(t, res.Rows, 4, out)
	for i, prefix := range []string{"rebuild ", "replay ", "ready, snapshot@", "ready, snapshot@"} {
		r := res.Rows[i]
		require.True(t, strings.HasPrefix(r.Workload, prefix), "row %d is %q", i, r.Workload)
		require.NotNil(t, r.Floor, r.Workload)
		require.Positive(t, r.Ratio, r.Workload)
		require.Positive(t, r.CgLedger.Calls, r.Workload)
	}
}
