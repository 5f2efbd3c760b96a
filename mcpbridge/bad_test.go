package mcpbridge

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

func fakeCommand(t *testing.T) ServerConfig {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return ServerConfig{Name: "fake", Prefix: strp(""), Command: []string{exe}, Env: map[string]string{"CGLEDGER_FAKE_MCP": "bad"},
		RestartMinMS: 100, RestartMaxMS: 1000}
}

// TestBadServerNamesGarbageAndSilence: of a tools/list with names no ledger
// tool may have, those are skipped with a logged reason and the rest
// registered; a tool whose server answers garbage ends failed
// S-TOOL-UNAVAILABLE or at its deadline, and one that never answers at its
// deadline, timeout; either way the call has one outcome and the server
// serves again.
func TestBadServerNamesGarbageAndSilence(t *testing.T) {
	r := newRig(t)
	b := r.start(t, fakeCommand(t))
	require.Equal(t, []string{"garbage", "getenv", "huge", "ok", "silent", "steps"}, b.Tools()["fake"])
	logs := r.logs.String()
	require.Contains(t, logs, `"bad name\" is not a ledger identifier`)
	require.Contains(t, logs, `"dotted.name\" is not a ledger identifier`)
	require.Contains(t, logs, `"echo\" is a built-in tool's name`)

	ok := r.dispatch(t, "ok", "mcp_fake", `{}`, 0)
	res := decodeResult(t, r.result(t, ok))
	require.Equal(t, "ok from bad", res.Content[0]["text"])

	silent := r.dispatch(t, "silent", "mcp_fake", `{}`, 1500)
	tr := r.result(t, silent)
	require.Equal(t, protocol.StatusTimeout, tr.Status)
	require.Equal(t, executor.CodeTimeout, errDetail(t, tr).TaxonomyCode)

	garbage := r.dispatch(t, "garbage", "mcp_fake", `{}`, 3000)
	tr = r.result(t, garbage)
	switch tr.Status {
	case protocol.StatusFailed:
		require.Equal(t, protocol.CodeToolUnavailable, errDetail(t, tr).TaxonomyCode)
	case protocol.StatusTimeout:
	default:
		t.Fatalf("garbage: %s %s", tr.Status, tr.Result)
	}
	for _, c := range []string{ok.ID, silent.ID, garbage.ID} {
		require.False(t, strings.Contains(c, " "))
	}
	require.Equal(t, 1, r.reports(t, silent))
	require.Equal(t, 1, r.reports(t, garbage))

	// It serves again (after a restart, if the garbage broke the session).
	require.Eventually(t, func() bool {
		c := r.dispatch(t, "ok", "mcp_fake", `{}`, 0)
		return r.result(t, c).Status == protocol.StatusSuccess
	}, 30e9, 200e6)
}

// TestStdioServerEnvironment: a stdio server gets the default few
// variables, those inherit_env names and env, and nothing else of the
// bridge's environment (its secrets).
func TestStdioServerEnvironment(t *testing.T) {
	t.Setenv("CGLEDGER_NATS_PASSWORD", "bridge-secret")
	t.Setenv("MCP_WANTED", "wanted")
	r := newRig(t)
	cfg := fakeCommand(t)
	cfg.InheritEnv = []string{"MCP_WANTED"}
	r.start(t, cfg)
	for name, want := range map[string]string{"CGLEDGER_NATS_PASSWORD": "false:", "MCP_WANTED": "true:wanted", "CGLEDGER_FAKE_MCP": "true:bad", "PATH": "true:" + os.Getenv("PATH")} {
		res := decodeResult(t, r.result(t, r.dispatch(t, "getenv", "mcp_fake", `{"name":"`+name+`"}`, 0)))
		require.Equal(t, want, res.Content[0]["text"], name)
	}
}

// TestProgressKeepsTheLastStep: a server that sends its steps faster than
// the rate limit right before its result has its last step in the result
// (the SDK hands notifications to the bridge apart from the response; the
// bridge waits for those that came before it).
func TestProgressKeepsTheLastStep(t *testing.T) {
	r := newRig(t)
	r.start(t, fakeCommand(t))
	for i := 0; i < 5; i++ {
		res := decodeResult(t, r.result(t, r.dispatch(t, "steps", "mcp_fake", `{}`, 0)))
		require.NotEmpty(t, res.Progress)
		require.EqualValues(t, 1, res.Progress[0].Progress, "the first step is kept")
		last := res.Progress[len(res.Progress)-1]
		require.EqualValues(t, 5, last.Progress, "the last step is kept: %+v", res.Progress)
		require.Equal(t, "step 5", last.Message)
		require.Len(t, res.Progress, 2, "rate limited: the first, and the latest")
	}
}

// TestDuplicateToolName: a tools/list naming a tool twice registers the
// first listed, with a warning naming it, the same on every listing.
func TestDuplicateToolName(t *testing.T) {
	r := newRig(t)
	cfg := fakeCommand(t)
	cfg.Env["CGLEDGER_FAKE_MCP"] = "dup"
	r.start(t, cfg)
	st, err := r.L.GetTool(ledgertest.Ctx(t), "proj", "getenv")
	require.NoError(t, err)
	require.Equal(t, "the first getenv", st.Definition.Description)
	require.Contains(t, r.logs.String(), `MCP tool not registered`)
	require.Contains(t, r.logs.String(), `mcp_tool=getenv`)
	require.Contains(t, r.logs.String(), `listed twice`)
	seq := st.Seq
	// Listing again changes nothing (no new version each time).
	require.NoError(t, r.b.servers[0].register(ledgertest.Ctx(t), r.b.servers[0].session()))
	st, err = r.L.GetTool(ledgertest.Ctx(t), "proj", "getenv")
	require.NoError(t, err)
	require.Equal(t, seq, st.Seq)
}

// TestResultTooLargeNamesTheViolation: a result larger than a card ends
// failed S-TOOL-RESULT with a message naming the violation (field, size,
// limit), and the violations in error.detail.
func TestResultTooLargeNamesTheViolation(t *testing.T) {
	r := newRig(t)
	r.start(t, fakeCommand(t))
	tr := r.result(t, r.dispatch(t, "huge", "mcp_fake", `{}`, 0))
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, "S-TOOL-RESULT", errDetail(t, tr).TaxonomyCode)
	require.Regexp(t, `is \d+ bytes.*the limit is \d+ \(too_large\)`, tr.Error.Message)
	var d struct {
		Violations []protocol.Violation `json:"violations"`
	}
	require.NoError(t, json.Unmarshal(tr.Error.Detail, &d))
	require.Len(t, d.Violations, 1)
	require.Equal(t, protocol.VTooLarge, d.Violations[0].Code)
}
