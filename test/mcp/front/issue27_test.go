package front

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServeRefusesCredentialsThatCannotDispatch: `cgledger mcp serve` with
// a credential that may read the project's tools but not dispatch as the
// agent ends with exit 1 and the reason before serving, instead of
// answering tools/list and timing out on tools/call.
func TestServeRefusesCredentialsThatCannotDispatch(t *testing.T) {
	s := startServer(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"auditor", []string{"--project", "p1", "--role", "auditor"}, "auditor credential may not dispatch"},
		{"tool", []string{"--project", "p1", "--role", "tool", "--tool", "t1"}, "tool credential may not dispatch"},
		{"another agent's worker", []string{"--project", "p1", "--role", "worker", "--agent", "a2"}, "bound to agent a2"},
	} {
		cred := s.issue(t, c.args...)
		_, errOut, code := s.run(t, "mcp", "serve", "--project", "p1", "--agent", "a1", "--creds", cred.Path)
		require.Equal(t, 1, code, "%s: %s", c.name, errOut)
		require.Contains(t, errOut, c.want, c.name)
		require.Contains(t, errOut, "cannot dispatch as agent a1 in project p1", c.name)
	}
}

// TestOriginCheckedBeforeCredentials: a cross-site request to /mcp is 403
// with or without a bearer token, before authentication says 401.
func TestOriginCheckedBeforeCredentials(t *testing.T) {
	s := startServer(t)
	req, err := http.NewRequest(http.MethodPost, s.httpURL()+"/mcp/p1/a1", strings.NewReader(initialize))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Origin", "http://evil.example")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
}
