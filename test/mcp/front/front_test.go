package front

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/mcpfront"
)

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

type bearer struct {
	tok string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestHTTPCredentials: /mcp takes the bearer token as the rest of the HTTP
// API does; a worker of P reaches P's tools, as its agent only.
func TestHTTPCredentials(t *testing.T) {
	s := startServer(t)
	worker := s.issue(t, "--project", "p1", "--role", "worker", "--agent", "a1")
	other := s.issue(t, "--project", "p2", "--role", "worker", "--agent", "a1")
	auditor := s.issue(t, "--project", "p1", "--role", "auditor")
	post := func(path, tok string) int {
		req, err := http.NewRequest(http.MethodPost, s.httpURL()+path, strings.NewReader(initialize))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, post("/mcp/p1/a1", ""))
	require.Equal(t, http.StatusForbidden, post("/mcp/p1/a1", other.JWT), "another project's worker")
	require.Equal(t, http.StatusForbidden, post("/mcp/p1/a1", auditor.JWT), "an auditor does not dispatch")
	require.Equal(t, http.StatusForbidden, post("/mcp/p1/a2", worker.JWT), "bound to a1")
	require.Equal(t, http.StatusOK, post("/mcp/p1/a1", worker.JWT))

	ctx := ctxT(t)
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.httpURL() + "/mcp/p1/a1",
		HTTPClient: &http.Client{Transport: bearer{worker.JWT}}}, nil)
	require.NoError(t, err)
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	require.NoError(t, err)
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	require.Equal(t, []string{"echo", "sleep"}, names)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"hello": "ledger"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.JSONEq(t, `{"hello":"ledger"}`, res.Content[0].(*mcp.TextContent).Text)
	turn, call := res.Meta[mcpfront.MetaAgentTurnID].(string), res.Meta[mcpfront.MetaToolCallID].(string)

	// The whole story is in the ledger, and the chain verifies.
	require.Eventually(t, func() bool {
		out, _, code := s.run(t, "audit", "turn", turn, "--project", "p1", "--json")
		return code == 0 && strings.Contains(out, call) && strings.Contains(out, `"success"`)
	}, time.Minute, 100*time.Millisecond)
	// The agent had no roster entry: the front door set one (a1 -> a1), so
	// the report woke it (and would wake a worker of target a1).
	require.Contains(t, turnKinds(t, s, "p1", turn), "wakeup")
	_, errOut, code := s.run(t, "verify")
	require.Equal(t, 0, code, errOut)
}

// TestStdioBinary: `cgledger mcp serve` under the Go SDK's command
// transport, as an MCP host starts a server.
func TestStdioBinary(t *testing.T) {
	s := startServer(t)
	worker := s.issue(t, "--project", "p1", "--role", "worker", "--agent", "a1")
	other := s.issue(t, "--project", "p2", "--role", "worker")

	_, errOut, code := s.run(t, "mcp", "serve", "--project", "p1")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "--agent")
	_, errOut, code = s.run(t, "mcp", "nope")
	require.Equal(t, 2, code, errOut)

	// Another project's credential is refused at start, not at the first
	// call.
	_, errOut, code = s.run(t, "mcp", "serve", "--project", "p1", "--agent", "a1", "--creds", other.Path)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "p1")

	ctx := ctxT(t)
	cmd := exec.Command(binary, "mcp", "serve", "--project", "p1", "--agent", "a1", "--creds", worker.Path)
	cmd.Env = s.env()
	stderr := &servetest.LogBuffer{}
	cmd.Stderr = stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-stdio", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"over": "stdio"},
		Meta: mcp.Meta{mcpfront.MetaToolCallID: "stdio-1"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Equal(t, "stdio-1", res.Meta[mcpfront.MetaToolCallID])
	again, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"over": "stdio"},
		Meta: mcp.Meta{mcpfront.MetaToolCallID: "stdio-1"}})
	require.NoError(t, err)
	require.Equal(t, true, again.Meta[mcpfront.MetaDuplicate])
	require.Equal(t, res.Meta[mcpfront.MetaReportSeq], again.Meta[mcpfront.MetaReportSeq])
	// The worker credential may hear the wakeups of its target (a1), which
	// the front door made the agent's roster entry.
	require.Contains(t, turnKinds(t, s, "p1", res.Meta[mcpfront.MetaAgentTurnID].(string)), "wakeup")
	require.Contains(t, stderr.String(), "set its worker target to itself")
	require.NotContains(t, stderr.String(), "permissions violation")
}

// TestStdioBinaryOtherTarget: a credential bound to a worker target other
// than the agent may not hear the agent's wakeups; the front door says so
// and answers by polling.
func TestStdioBinaryOtherTarget(t *testing.T) {
	s := startServer(t)
	worker := s.issue(t, "--project", "p1", "--role", "worker", "--agent", "a1", "--target", "w9")
	ctx := ctxT(t)
	cmd := exec.Command(binary, "mcp", "serve", "--project", "p1", "--agent", "a1", "--creds", worker.Path)
	cmd.Env = s.env()
	stderr := &servetest.LogBuffer{}
	cmd.Stderr = stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-stdio", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sleep", Arguments: map[string]any{"ms": 200}})
	require.NoError(t, err)
	require.Equal(t, "success", res.Meta[mcpfront.MetaStatus])
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "permissions violation") },
		time.Minute, 20*time.Millisecond, "the refused subscription is logged")
}

// TestStdioBinaryAnswersAtEOF: a client that writes its calls to `cgledger
// mcp serve` and closes its input gets every answer, then the process
// exits 0.
func TestStdioBinaryAnswersAtEOF(t *testing.T) {
	s := startServer(t)
	worker := s.issue(t, "--project", "p1", "--role", "worker", "--agent", "a1")
	ctx := ctxT(t)
	cmd := exec.CommandContext(ctx, binary, "mcp", "serve", "--project", "p1", "--agent", "a1", "--creds", worker.Path)
	cmd.Env = s.env()
	cmd.Stdin = strings.NewReader(initialize + "\n" +
		`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n" +
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":1000}}}` + "\n" +
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"at":"eof"}}}` + "\n")
	stderr := &servetest.LogBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.Output()
	require.NoError(t, err, "exit 0; stderr: %s", stderr.String())
	answers := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var rp struct {
			ID     json.RawMessage    `json:"id"`
			Result mcp.CallToolResult `json:"result"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rp), line)
		if st, ok := rp.Result.Meta[mcpfront.MetaStatus].(string); ok {
			answers[string(rp.ID)] = st
		}
	}
	require.Equal(t, map[string]string{"2": "success", "3": "success"}, answers, "both calls answered: %s", out)
}

// turnKinds lists the kinds of the entries of a turn, in order.
func turnKinds(t *testing.T, s *server, project, turn string) []string {
	t.Helper()
	var kinds []string
	require.Eventually(t, func() bool {
		out, _, code := s.run(t, "audit", "turn", turn, "--project", project, "--json")
		if code != 0 {
			return false
		}
		var story struct {
			Items []struct {
				Kind string `json:"kind"`
			} `json:"items"`
		}
		if json.Unmarshal([]byte(out), &story) != nil {
			return false
		}
		kinds = kinds[:0]
		for _, it := range story.Items {
			kinds = append(kinds, it.Kind)
		}
		return slices.Contains(kinds, "wakeup") || slices.Contains(kinds, "wakeup_skipped")
	}, time.Minute, 100*time.Millisecond, "the turn's story, to its wakeup decision")
	return kinds
}

// TestTypeScriptClient: the official TypeScript SDK's client on /mcp.
func TestTypeScriptClient(t *testing.T) {
	dir, node := clients(t)
	s := startServer(t)
	worker := s.issue(t, "--project", "p1", "--role", "worker", "--agent", "a1")
	ctx := ctxT(t)
	cmd := exec.CommandContext(ctx, node, "ts-client.mjs", s.httpURL()+"/mcp/p1/a1")
	cmd.Dir = dir
	cmd.Env = append(s.env(), "CGLEDGER_MCP_TOKEN="+worker.JWT)
	out, err := cmd.Output()
	require.NoError(t, err, string(out))
	var got struct {
		Error     string `json:"error"`
		SessionID string `json:"sessionId"`
		Tools     []struct {
			Name        string         `json:"name"`
			Annotations map[string]any `json:"annotations"`
		} `json:"tools"`
		Echo, EchoAgain, Timeout, ProgressResult mcp.CallToolResult
		Progress                                 int `json:"progress"`
		Unknown                                  struct {
			Code int             `json:"code"`
			Data json.RawMessage `json:"data"`
		} `json:"unknown"`
	}
	require.NoError(t, json.Unmarshal(out, &got), string(out))
	require.Empty(t, got.Error)
	require.Len(t, got.Tools, 2)
	require.Equal(t, true, got.Tools[0].Annotations["readOnlyHint"])
	require.False(t, got.Echo.IsError)
	require.Equal(t, got.SessionID, got.Echo.Meta[mcpfront.MetaAgentTurnID], "the session is the turn")
	require.Equal(t, true, got.EchoAgain.Meta[mcpfront.MetaDuplicate])
	require.Equal(t, got.Echo.Meta[mcpfront.MetaReportSeq], got.EchoAgain.Meta[mcpfront.MetaReportSeq])
	require.True(t, got.Timeout.IsError)
	require.Equal(t, "timeout", got.Timeout.Meta[mcpfront.MetaStatus])
	require.False(t, got.ProgressResult.IsError)
	require.GreaterOrEqual(t, got.Progress, 2, "progress while sleep runs 1.5 s")
	require.Equal(t, -32602, got.Unknown.Code)
	require.Contains(t, string(got.Unknown.Data), "not_found")
}

// TestAskAgainAfterKill: the MCP server process dies mid-call (kill -9);
// the call runs on in the ledger, and the client, asking again in a new
// session with the call's ids, gets its one outcome.
func TestAskAgainAfterKill(t *testing.T) {
	s := startServer(t)
	worker := s.issue(t, "--project", "p1", "--role", "worker", "--agent", "a1")
	ctx := ctxT(t)
	connect := func() (*mcp.ClientSession, *exec.Cmd) {
		cmd := exec.Command(binary, "mcp", "serve", "--project", "p1", "--agent", "a1", "--creds", worker.Path)
		cmd.Env = s.env()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-stdio", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		require.NoError(t, err)
		return cs, cmd
	}
	params := &mcp.CallToolParams{Name: "sleep", Arguments: map[string]any{"ms": 1500},
		Meta: mcp.Meta{mcpfront.MetaToolCallID: "k9", mcpfront.MetaAgentTurnID: "turn-k9"}}
	cs, cmd := connect()
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, params)
		errc <- err
	}()
	require.Eventually(t, func() bool {
		_, _, code := s.run(t, "audit", "call", "k9", "--turn", "turn-k9", "--project", "p1")
		return code == 0
	}, time.Minute, 50*time.Millisecond, "the call is on the ledger")
	require.NoError(t, cmd.Process.Kill())
	require.Error(t, <-errc, "the first session died with its server")
	_ = cs.Close()

	cs2, _ := connect()
	defer cs2.Close()
	res, err := cs2.CallTool(ctx, params)
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Equal(t, "success", res.Meta[mcpfront.MetaStatus])
	require.Equal(t, true, res.Meta[mcpfront.MetaDuplicate], "asked again: the same call, not a second one")
	out, _, code := s.run(t, "audit", "call", "k9", "--turn", "turn-k9", "--project", "p1", "--json")
	require.Equal(t, 0, code)
	require.Equal(t, 1, strings.Count(out, `"kind":"command"`), "one command: %s", out)
	require.Equal(t, 1, strings.Count(out, `"kind":"report"`), "one outcome: %s", out)
}
