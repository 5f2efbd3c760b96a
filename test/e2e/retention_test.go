package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// readyz is the part of /readyz the retention test reads.
type readyz struct {
	Status      string `json:"status"`
	LastSeq     uint64 `json:"last_seq"`
	AppliedSeq  uint64 `json:"applied_seq"`
	ArchivedSeq uint64 `json:"archived_seq"`
	Lost        uint64 `json:"archive_lost_entries"`
}

func getOpen(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	return resp.StatusCode
}

// TestRetentionArchivesAcrossKill9AndRebuildsFromTheArchive runs serve with
// a retention window short enough to pass during the test: the ledger
// stream lets the calls' entries go, the archive keeps them across a
// kill -9, tools and rosters stay usable, and a rebuild from no views, an
// export, verify and replay all see the whole history from seq 1.
func TestRetentionArchivesAcrossKill9AndRebuildsFromTheArchive(t *testing.T) {
	const window = 10 * time.Second
	data := t.TempDir()
	np, hp := servetest.FreePort(t), servetest.FreePort(t)
	flags := []string{"--no-auth", "--retention", window.String(), "--archive-seal-age", "300ms"}
	s := startServer(t, data, np, hp, flags...)
	def := filepath.Join(t.TempDir(), "shout.yaml")
	require.NoError(t, os.WriteFile(def, []byte("tool_name: shout\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo\nafter_execution: terminate\n"), 0o600))
	out, code := s.run(t, "tools", "register", def, "--project", "demo")
	require.Equal(t, 0, code, out)
	for i := range 3 {
		out, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", fmt.Sprintf(`{"i":%d}`, i), "--turn", "t1", "--call-id", fmt.Sprintf("c%d", i))
		require.Equal(t, 0, code, out)
	}
	var tl struct {
		Items []json.RawMessage `json:"items"`
	}
	require.Equal(t, 200, getOpen(t, s.httpURL()+"/v1/projects/demo/turns/t1/timeline", &tl))
	before := len(tl.Items)
	require.Positive(t, before)

	// kill -9 straight after the calls: the newest entries may not be
	// sealed yet; the restart archives them from the stream.
	s.kill(t)
	s = startServer(t, data, np, hp, flags...)
	var rz readyz
	require.Eventually(t, func() bool {
		return getOpen(t, s.httpURL()+"/readyz", &rz) == 200 && rz.ArchivedSeq == rz.LastSeq
	}, time.Minute, 20*time.Millisecond, "the archive holds every entry")
	written := rz.LastSeq

	// The stream lets the calls' entries go; it keeps tool definitions
	// and roster entries (and anything written since).
	nc, err := nats.Connect(s.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := js.Stream(ctx, "CG_LEDGER")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := st.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs < written/2
	}, window+time.Minute, 100*time.Millisecond, "the stream's retention window to pass")

	// A registered tool outlives the window, across a restart (nats-server
	// expires what is due when it starts): a call after it works.
	s.kill(t)
	s = startServer(t, data, np, hp, flags...)
	out, code = s.run(t, "tools", "list", "--project", "demo")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "shout")
	out, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "shout", "--args", `{"after":true}`, "--turn", "t2", "--call-id", "c9")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "status:     success")

	// Rebuild the views from nothing: archive, then stream.
	s.kill(t)
	require.NoError(t, os.RemoveAll(filepath.Join(data, "views")))
	s = startServer(t, data, np, hp, flags...)
	tl.Items = nil
	require.Equal(t, 200, getOpen(t, s.httpURL()+"/v1/projects/demo/turns/t1/timeline", &tl))
	require.Len(t, tl.Items, before, "the rebuilt views hold the expired calls")
	require.Equal(t, 200, getOpen(t, s.httpURL()+"/readyz", &rz))
	require.Zero(t, rz.Lost)
	last := rz.LastSeq

	out, code = s.run(t, "verify", "--json")
	require.Equal(t, 0, code, out)
	var live map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &live))
	require.Equal(t, true, live["ok"], out)

	export := filepath.Join(t.TempDir(), "ledger.jsonl")
	out, code = s.run(t, "export", "--out", export)
	require.Equal(t, 0, code, out)
	raw, err := os.ReadFile(export)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.GreaterOrEqual(t, uint64(len(lines)-2), last, "the export holds every entry from seq 1")
	require.Contains(t, lines[0], `"from_seq":1`)
	out, code = s.run(t, "verify", export)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "chain:      OK")
	out, code = s.run(t, "replay", export, "--json", "--expect", live["digest"].(string))
	require.Equal(t, 0, code, "the replayed views equal the live server's: %s", out)

	// Every sealed segment is an export file of its own.
	segs, err := filepath.Glob(filepath.Join(data, "archive", "*.jsonl"))
	require.NoError(t, err)
	require.NotEmpty(t, segs)
	for _, seg := range segs {
		out, code = s.run(t, "verify", seg)
		require.Equal(t, 0, code, "%s: %s", seg, out)
	}

	// Retention turned off: entries written under the window keep their
	// TTL, so the archiver goes on (it seals what has no TTL by its seal
	// age, an hour here, and at shutdown).
	s.kill(t)
	s = startServer(t, data, np, hp, "--no-auth")
	out, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "shout", "--args", `{"off":true}`, "--turn", "t3", "--call-id", "c10")
	require.Equal(t, 0, code, out)
	rz = readyz{}
	require.Equal(t, 200, getOpen(t, s.httpURL()+"/readyz", &rz))
	require.Greater(t, rz.LastSeq, last)
	require.GreaterOrEqual(t, rz.ArchivedSeq, last, "the archiver runs without retention")
	require.Zero(t, rz.Lost)
	require.NoError(t, s.Cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, s.Cmd.Wait(), "a clean shutdown")
	segs, err = filepath.Glob(filepath.Join(data, "archive", "*.jsonl"))
	require.NoError(t, err)
	sort.Strings(segs)
	require.Contains(t, segs[len(segs)-1], fmt.Sprintf("-%020d.jsonl", rz.LastSeq), "sealed at shutdown through the last entry")
}

func TestRetentionSettingsAreChecked(t *testing.T) {
	s := addrs(servetest.FreePort(t), servetest.FreePort(t))
	out, code := s.run(t, "check-config", "--retention", "30d", "--archive-seal-age", "2h")
	require.Equal(t, 0, code, out)
	var cc struct {
		Valid      bool `json:"valid"`
		Violations []struct {
			Field string `json:"field"`
			Code  string `json:"code"`
		} `json:"violations"`
	}
	out, code = s.run(t, "check-config", "--retention", "soon", "--archive-seal-age", "-1s")
	require.Equal(t, 2, code, out)
	require.NoError(t, json.Unmarshal([]byte(out), &cc))
	require.False(t, cc.Valid)
	var fields []string
	for _, v := range cc.Violations {
		fields = append(fields, v.Field+":"+v.Code)
	}
	require.ElementsMatch(t, []string{"retention:invalid_value", "archive_seal_age:invalid_value"}, fields)
	out, code = s.run(t, "check-config", "--retention", "1h", "--archive-seal-age", "31m")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "at most half of retention")
}
