package mcpbridge

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestServerEverything: the bridge in front of
// @modelcontextprotocol/server-everything. Its tools are registered with
// their schemas and determinism from their annotations, except echo (a
// built-in's name). get-sum answers text; get-structured-content
// structured content; get-tiny-image an image, kept as a reference;
// trigger-long-running-operation sends progress, which is recorded, and
// is canceled (notifications/cancelled) and timed out with its progress
// in the result card; arguments outside the schema never reach it.
func TestServerEverything(t *testing.T) {
	r := newRig(t)
	b := r.start(t, ServerConfig{Name: "everything", Prefix: strp(""), Command: nodeServer(t, "server-everything", "stdio")})
	tools := b.Tools()["everything"]
	for _, n := range []string{"get-sum", "get-tiny-image", "get-structured-content", "trigger-long-running-operation"} {
		require.Contains(t, tools, n)
	}
	require.NotContains(t, tools, "echo", "echo is a built-in's name")
	require.Contains(t, r.logs.String(), `"echo\" is a built-in tool's name`)
	st, err := r.L.GetTool(ledgertest.Ctx(t), "proj", "get-sum")
	require.NoError(t, err)
	require.Equal(t, protocol.DeterminismPure, st.Definition.Determinism, "readOnlyHint")
	require.Equal(t, "cg.v1.{project_id}.{channel_id}.cmd.tool.mcp_everything", st.Definition.TargetSubject)
	require.Contains(t, string(st.Definition.Parameters), `"a"`)
	require.True(t, strings.HasPrefix(st.Definition.Version, "") && strings.Contains(st.Definition.Version, "+mcp."), st.Definition.Version)

	sum := decodeResult(t, r.result(t, r.dispatch(t, "get-sum", "mcp_everything", `{"a":2,"b":3}`, 0)))
	require.Equal(t, "text", sum.Content[0]["type"])
	require.Contains(t, sum.Content[0]["text"], "5")
	require.Equal(t, "get-sum", sum.Tool)

	sc := decodeResult(t, r.result(t, r.dispatch(t, "get-structured-content", "mcp_everything", `{"location":"Chicago"}`, 0)))
	require.NotNil(t, sc.StructuredContent)
	require.Contains(t, sc.StructuredContent, "temperature")

	img := decodeResult(t, r.result(t, r.dispatch(t, "get-tiny-image", "mcp_everything", `{}`, 0)))
	var image map[string]any
	for _, c := range img.Content {
		if c["type"] == "image" {
			image = c
		}
	}
	require.NotNil(t, image, "an image in %v", img.Content)
	require.Equal(t, "image/png", image["mimeType"])
	require.NotContains(t, image, "data")
	ref := image["data_ref"].(map[string]any)
	require.Len(t, ref["sha256"], 64)
	require.Positive(t, ref["size"])
	require.NotEmpty(t, ref["data"], "a tiny image fits max_inline_bytes")

	long := decodeResult(t, r.result(t, r.dispatch(t, "trigger-long-running-operation", "mcp_everything", `{"duration":2,"steps":4}`, 0)))
	// Every notification that came before the result is handed over
	// before it is written: the last step is kept.
	require.NotEmpty(t, long.Progress, "progress recorded")
	require.EqualValues(t, 4, long.Progress[len(long.Progress)-1].Progress, "the latest step always: %+v", long.Progress)
	prev := 0.0
	for _, p := range long.Progress {
		require.Greater(t, p.Progress, prev, "in order")
		require.LessOrEqual(t, p.Progress, 4.0)
		require.EqualValues(t, 4, p.Total)
		prev = p.Progress
	}
	require.Less(t, len(long.Progress), 4, "rate limited: at most one a second of steps of half a second (and the latest)")

	bad := r.result(t, r.dispatch(t, "get-sum", "mcp_everything", `{"a":"two"}`, 0))
	require.Equal(t, protocol.StatusFailed, bad.Status)
	require.Equal(t, executor.CodeInvalidArgs, errDetail(t, bad).TaxonomyCode, "the ledger's schema check, before MCP")

	// A call that outlives its deadline ends timeout with its progress.
	slow := r.dispatch(t, "trigger-long-running-operation", "mcp_everything", `{"duration":20,"steps":40}`, 2500)
	tr := r.result(t, slow)
	require.Equal(t, protocol.StatusTimeout, tr.Status)
	require.NotEmpty(t, errDetail(t, tr).Progress)

	// A worker's cancel reaches the MCP server as notifications/cancelled.
	c := r.dispatch(t, "trigger-long-running-operation", "mcp_everything", `{"duration":20,"steps":40}`, 60_000)
	require.Eventually(t, func() bool { return r.inFlight(b, "everything") }, time.Minute, 20*time.Millisecond)
	_, err = r.L.Cancel(ledgertest.Ctx(t), protocol.CancelRequest{ProjectID: c.Project, AgentID: c.Agent, AgentTurnID: c.Turn, ToolCallID: c.ID})
	require.NoError(t, err)
	tr = r.result(t, c)
	require.Equal(t, protocol.StatusCanceled, tr.Status)
}

// inFlight reports whether server name has a call in flight with progress.
func (r *rig) inFlight(b *Bridge, name string) bool {
	for _, s := range b.servers {
		if s.cfg.Name != name {
			continue
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.calls {
			if len(c.call.ProgressLog()) > 0 {
				return true
			}
		}
	}
	return false
}

// TestServerFilesystem: server-filesystem on a temporary directory. Reads
// and writes reach the disk; an isError answer ends failed with the
// server's text as the message; determinism follows the annotations.
func TestServerFilesystem(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello, ledger"), 0o600))
	r := newRig(t)
	b := r.start(t, ServerConfig{Name: "fs", Command: nodeServer(t, "server-filesystem", dir)})
	require.Contains(t, b.Tools()["fs"], "fs_read_text_file")
	for name, det := range map[string]string{"fs_read_text_file": protocol.DeterminismPure, "fs_write_file": protocol.DeterminismIdempotent, "fs_edit_file": protocol.DeterminismSideEffectful} {
		st, err := r.L.GetTool(ledgertest.Ctx(t), "proj", name)
		require.NoError(t, err)
		require.Equal(t, det, st.Definition.Determinism, name)
	}

	read := decodeResult(t, r.result(t, r.dispatch(t, "fs_read_text_file", "mcp_fs", `{"path":"`+filepath.Join(dir, "hello.txt")+`"}`, 0)))
	require.Equal(t, "hello, ledger", read.Content[0]["text"])

	target := filepath.Join(dir, "out.txt")
	decodeResult(t, r.result(t, r.dispatch(t, "fs_write_file", "mcp_fs", `{"path":"`+target+`","content":"written through the ledger"}`, 0)))
	got, err := os.ReadFile(target)
	require.NoError(t, err)
	require.Equal(t, "written through the ledger", string(got))

	missing := r.result(t, r.dispatch(t, "fs_read_text_file", "mcp_fs", `{"path":"`+filepath.Join(dir, "nope.txt")+`"}`, 0))
	require.Equal(t, protocol.StatusFailed, missing.Status)
	require.Equal(t, CodeToolError, errDetail(t, missing).TaxonomyCode)
	require.Contains(t, missing.Error.Message, "nope.txt")
}

// TestServerMemory: server-memory's create_entities is side_effectful (no
// hints): its attempt is on record before it runs; read_graph (readOnly)
// sees the entity.
func TestServerMemory(t *testing.T) {
	r := newRig(t)
	r.start(t, ServerConfig{Name: "memory", Command: nodeServer(t, "server-memory"),
		Env: map[string]string{"MEMORY_FILE_PATH": filepath.Join(t.TempDir(), "memory.jsonl")}})
	st, err := r.L.GetTool(ledgertest.Ctx(t), "proj", "memory_create_entities")
	require.NoError(t, err)
	require.Equal(t, protocol.DeterminismSideEffectful, st.Definition.Determinism)

	c := r.dispatch(t, "memory_create_entities", "mcp_memory", `{"entities":[{"name":"cgledger","entityType":"project","observations":["records every call"]}]}`, 0)
	decodeResult(t, r.result(t, c))
	require.Equal(t, 1, r.entries(t, c, protocol.KindAttempt), "the attempt was recorded before the effect")

	graph := decodeResult(t, r.result(t, r.dispatch(t, "memory_read_graph", "mcp_memory", `{}`, 0)))
	require.Contains(t, graph.Content[0]["text"], "records every call")
}

// TestKillTheMCPServerMidCall: kill -9 of the stdio servers while calls
// run. Each call ends with one outcome: S-TOOL-UNAVAILABLE for the pure
// tool, S-TOOL-OUTCOME-UNKNOWN for the same tool made side_effectful by
// the configuration (its request was sent: it may have acted, so it is
// never run again). Calls while a server is down fail fast with
// S-TOOL-UNAVAILABLE, and after the restart (with backoff) calls succeed
// again.
func TestKillTheMCPServerMidCall(t *testing.T) {
	r := newRig(t)
	cmd := nodeServer(t, "server-everything", "stdio")
	b := r.start(t,
		ServerConfig{Name: "everything", Command: cmd, RestartMinMS: 3000, RestartMaxMS: 3000},
		ServerConfig{Name: "sfx", Command: cmd, RestartMinMS: 3000, RestartMaxMS: 3000,
			Tools: map[string]ToolOverride{"trigger-long-running-operation": {Determinism: protocol.DeterminismSideEffectful}}})
	pure := r.dispatch(t, "everything_trigger-long-running-operation", "mcp_everything", `{"duration":30,"steps":60}`, 60_000)
	sfx := r.dispatch(t, "sfx_trigger-long-running-operation", "mcp_sfx", `{"duration":30,"steps":60}`, 60_000)
	require.Eventually(t, func() bool { return r.inFlight(b, "everything") && r.inFlight(b, "sfx") }, time.Minute, 20*time.Millisecond)
	for _, s := range b.servers {
		s.mu.Lock()
		proc := s.cmd.Process
		s.mu.Unlock()
		require.NoError(t, proc.Signal(syscall.SIGKILL))
	}

	tr := r.result(t, pure)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, protocol.CodeToolUnavailable, errDetail(t, tr).TaxonomyCode)
	require.Equal(t, protocol.ErrorCodeUpstreamUnavailable, tr.Error.Code)
	require.NotEmpty(t, errDetail(t, tr).Progress, "the progress before the kill is kept")

	tr = r.result(t, sfx)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, protocol.CodeToolOutcomeUnknown, errDetail(t, tr).TaxonomyCode)
	require.Equal(t, 1, r.entries(t, sfx, protocol.KindAttempt), "never run again")

	start := time.Now()
	down := r.dispatch(t, "everything_get-sum", "mcp_everything", `{"a":1,"b":1}`, 0)
	tr = r.result(t, down)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, protocol.CodeToolUnavailable, errDetail(t, tr).TaxonomyCode)
	t.Logf("failed fast in %s", time.Since(start))

	require.Eventually(t, func() bool {
		return r.result(t, r.dispatch(t, "everything_get-sum", "mcp_everything", `{"a":1,"b":1}`, 0)).Status == protocol.StatusSuccess
	}, time.Minute, 200*time.Millisecond)
	for _, c := range []ledgertest.Call{pure, sfx, down} {
		require.Equal(t, 1, r.reports(t, c), "one outcome for %s", c.ID)
	}
}
