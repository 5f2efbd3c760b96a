package e2e

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// TestCLIToolsPauseResume: the admin's tools pause and resume through the
// built binary and its HTTP endpoints: the state changes once, a repeat
// is refused (exit 1, the conflict named), missing flags are all named.
func TestCLIToolsPauseResume(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))

	_, errOut, code := s.runAll(t, "tools", "pause", "--project", "demo")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--reason, --tool required")

	out, code := s.run(t, "tools", "pause", "--project", "demo", "--tool", "echo", "--reason", "upstream outage")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "paused echo in project demo")
	_, errOut, code = s.runAll(t, "tools", "pause", "--project", "demo", "--tool", "echo", "--reason", "again")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "paused since seq")
	_, errOut, code = s.runAll(t, "tools", "pause", "--project", "demo", "--tool", "nosuch", "--reason", "x")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no tool nosuch is registered")

	out, code = s.run(t, "tools", "resume", "--project", "demo", "--tool", "echo", "--reason", "back", "--json")
	require.Equal(t, 0, code, out)
	var res struct {
		Seq      uint64 `json:"seq"`
		Paused   bool   `json:"paused"`
		Released int    `json:"released"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.False(t, res.Paused)
	require.NotZero(t, res.Seq)
	_, errOut, code = s.runAll(t, "tools", "resume", "--project", "demo", "--tool", "echo", "--reason", "again")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "running since seq")

	// The echo tool runs again: a call is served.
	out, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"hi"}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "status:     success")
}
