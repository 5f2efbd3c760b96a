package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// TestServeKilledAcrossADeadlineStillRecordsTheTimeout: a call to a tool
// nobody serves is dispatched, serve is killed (SIGKILL) before its
// deadline and started again well after it: the restarted serve records
// the call's timeout, once, and the replayed views agree.
func TestServeKilledAcrossADeadlineStillRecordsTheTimeout(t *testing.T) {
	data := t.TempDir()
	np, hp := servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, np, hp)

	// The verb dispatches, then waits; it loses its server below and is
	// stopped at the end.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	call := exec.CommandContext(ctx, binary, "call", "--project", "demo", "--agent", "alice", "--tool", "nobody", "--timeout", "3s", "--turn", "tk", "--call-id", "ck")
	call.Env = append(os.Environ(), "CGLEDGER_NATS_URL="+s.natsURL(), "CGLEDGER_SERVER="+s.httpURL(), "CGLEDGER_DATA="+s.Data)
	require.NoError(t, call.Start())
	defer func() {
		cancel()
		_ = call.Wait()
	}()
	type callState struct {
		Call struct {
			State       string `json:"state"`
			ReportedSeq uint64 `json:"reported_seq"`
			Status      string `json:"status"`
		} `json:"call"`
	}
	url := s.httpURL() + "/v1/projects/demo/turns/tk/calls/ck"
	require.Eventually(t, func() bool {
		var st callState
		return s.getJSON(t, url, &st) == 200 && st.Call.State == "dispatched"
	}, time.Minute, 20*time.Millisecond, "the call is dispatched")
	dispatchedBy := time.Now()
	s.kill(t)

	// Down across the deadline (3 s from dispatch) and its grace (5 s).
	require.Eventually(t, func() bool { return time.Since(dispatchedBy) > 10*time.Second }, time.Minute, 100*time.Millisecond)
	s = startServer(t, data, np, hp)
	var st callState
	require.Eventually(t, func() bool {
		return s.getJSON(t, url, &st) == 200 && st.Call.ReportedSeq != 0
	}, time.Minute, 50*time.Millisecond, "the restarted serve records the timeout")
	require.Equal(t, "timeout", st.Call.Status)

	export := filepath.Join(t.TempDir(), "ledger.jsonl")
	out, code := s.run(t, "export", "--out", export)
	require.Equal(t, 0, code, out)
	raw, err := os.ReadFile(export)
	require.NoError(t, err)
	reports, cancels := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var e struct {
			Subject string              `json:"subject"`
			Headers map[string][]string `json:"headers"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &e))
		kind := e.Headers["CG-Entry-Kind"]
		switch {
		case len(kind) == 1 && kind[0] == "report" && strings.HasSuffix(e.Subject, ".tk.ck"):
			reports++
			require.Equal(t, []string{"cgledger-deadline"}, e.Headers["CG-Source-Id"])
		case len(kind) == 1 && kind[0] == "cancel" && strings.HasSuffix(e.Subject, ".tk.ck"):
			cancels++
		}
	}
	require.Equal(t, 1, reports, "one report: the ledger's timeout")
	require.Equal(t, 1, cancels, "one cancel sent to the tool")

	out, code = s.run(t, "verify", "--json")
	require.Equal(t, 0, code)
	var live map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &live))
	require.Equal(t, true, live["ok"])
	out, code = s.run(t, "replay", export, "--json", "--expect", live["digest"].(string))
	require.Equal(t, 0, code, "the replayed views equal the live server's: %s", out)
}
