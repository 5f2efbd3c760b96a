package front

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/testenv"
	"github.com/cgledger/cgledger/mcpfront"
)

// everythingCommand is server-everything's command line (stdio), or a
// skip (a failure under CGLEDGER_CI=1) when `make tools` has not run.
func everythingCommand(t *testing.T, node string) string {
	t.Helper()
	main, err := filepath.Abs(filepath.Join("..", "servers", "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"))
	require.NoError(t, err)
	if _, err := os.Stat(main); err != nil {
		testenv.Skip(t, "server-everything is not installed (make tools, or npm ci in test/mcp/servers): %v", err)
	}
	return fmt.Sprintf("[%q, %q, stdio]", node, main)
}

// TestBothWays: an MCP client (the Go SDK's, with a worker's bearer token)
// calls, through /mcp, tools that serve's mcp role bridges from
// @modelcontextprotocol/server-everything: MCP on both sides of the
// ledger. Text, progress while a long call runs, an image (its bytes kept
// as a reference in the result card, given back whole), structured
// content; then `cgledger audit turn` tells each call's whole story and
// `cgledger verify` passes. The README's TypeScript SDK client (call.mjs)
// calls the same tools.
func TestBothWays(t *testing.T) {
	dir, node := clients(t)
	cfg := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("project: demo\nservers:\n  - name: everything\n    prefix: \"\"\n    command: "+everythingCommand(t, node)+"\n"), 0o600))
	s := startServer(t, "--roles", "api,executor,projector,mcp", "--mcp-bridge", cfg)
	worker := s.issue(t, "--project", "demo", "--role", "worker", "--agent", "assistant")
	url := s.httpURL() + "/mcp/demo/assistant"
	httpc := &http.Client{Transport: bearer{worker.JWT}}
	waitToolsWith(t, url, httpc, "get-sum", "trigger-long-running-operation", "get-tiny-image", "get-structured-content")

	ctx := ctxT(t)
	var progress atomic.Int32
	c := mcp.NewClient(&mcp.Implementation{Name: "both-ways", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, _ *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
	})
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: httpc}, nil)
	require.NoError(t, err)
	defer cs.Close()

	call := func(name string, args map[string]any, meta mcp.Meta) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args, Meta: meta})
		require.NoError(t, err, name)
		require.False(t, res.IsError, "%s: %+v", name, res.Content)
		require.Equal(t, "success", res.Meta[mcpfront.MetaStatus], name)
		return res
	}
	sum := call("get-sum", map[string]any{"a": 2, "b": 3}, nil)
	require.Contains(t, sum.Content[0].(*mcp.TextContent).Text, "5")

	long := call("trigger-long-running-operation", map[string]any{"duration": 2, "steps": 4}, mcp.Meta{"progressToken": "long-1"})
	require.Contains(t, long.Content[0].(*mcp.TextContent).Text, "completed")
	require.GreaterOrEqual(t, progress.Load(), int32(2), "progress while the two-second call runs")

	img := call("get-tiny-image", nil, nil)
	var image *mcp.ImageContent
	for _, c := range img.Content {
		if i, ok := c.(*mcp.ImageContent); ok {
			image = i
		}
	}
	require.NotNil(t, image, "an image in %+v", img.Content)
	require.Equal(t, "image/png", image.MIMEType)
	require.Equal(t, "\x89PNG", string(image.Data[:4]), "the image's bytes, whole")

	sc := call("get-structured-content", map[string]any{"location": "Chicago"}, nil)
	structured, err := json.Marshal(sc.StructuredContent)
	require.NoError(t, err)
	require.Contains(t, string(structured), "temperature")

	// The whole story of every call is in the turn (the session's).
	turn := sum.Meta[mcpfront.MetaAgentTurnID].(string)
	require.Equal(t, cs.ID(), turn, "the session is the turn")
	out, errOut, code := s.run(t, "audit", "turn", turn, "--project", "demo", "--json")
	require.Equal(t, 0, code, errOut)
	var story struct {
		Items []struct {
			Kind    string              `json:"kind"`
			Headers map[string][]string `json:"headers"`
			Data    struct {
				Type string `json:"type"`
			} `json:"data"`
		} `json:"items"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &story), out)
	// Per call: the dispatch's tool.call card, the command, the bridge's
	// tool.result card, the report and its wakeup (the front door set the
	// agent's roster entry to itself, and was answered on the wakeup).
	calls := map[string][]string{}
	for _, it := range story.Items {
		id := it.Headers["CG-Tool-Call-Id"]
		require.Len(t, id, 1, "every entry of the turn belongs to a call: %s", it.Kind)
		k := it.Kind
		if k == "card" {
			k += ":" + it.Data.Type
		}
		calls[id[0]] = append(calls[id[0]], k)
	}
	require.Len(t, calls, 4, out)
	for id, kinds := range calls {
		require.Equal(t, []string{"card:tool.call", "command", "card:tool.result", "report", "wakeup"}, kinds, "call %s", id)
	}
	// The README's one-file TypeScript SDK client, on the same tools.
	ts := exec.CommandContext(ctx, node, "call.mjs", url, "get-sum", `{"a":4,"b":5}`)
	ts.Dir, ts.Env = dir, append(s.env(), "CGLEDGER_MCP_TOKEN="+worker.JWT)
	tsOut, err := ts.Output()
	require.NoError(t, err, string(tsOut))
	require.Contains(t, string(tsOut), "The sum of 4 and 5 is 9.")
	require.Contains(t, string(tsOut), `"cgledger/status":"success"`)

	_, errOut, code = s.run(t, "verify")
	require.Equal(t, 0, code, errOut)
}

// waitToolsWith waits until tools/list on url, through httpc, has every
// tool of names (the bridge registers them after serve is ready).
func waitToolsWith(t *testing.T, url string, httpc *http.Client, names ...string) {
	t.Helper()
	ctx := ctxT(t)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "wait", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: httpc}, nil)
	require.NoError(t, err)
	defer cs.Close()
	require.Eventually(t, func() bool {
		res, err := cs.ListTools(ctx, nil)
		if err != nil {
			return false
		}
		have := map[string]bool{}
		for _, tl := range res.Tools {
			have[tl.Name] = true
		}
		for _, n := range names {
			if !have[n] {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "the bridge registers %v", names)
}
