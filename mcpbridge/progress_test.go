package mcpbridge

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// TestProgressScanner: progress notifications are found in
// newline-delimited JSON-RPC and in event streams, however the bytes are
// split; other messages and over-long lines are passed through unread.
func TestProgressScanner(t *testing.T) {
	stream := `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"a-1","progress":1}}` + "\n" +
		`event: message` + "\n" + `data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"a-2","progress":1}}` + "\n\n" +
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"notifications/progress"}]}}` + "\n" +
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"big","pad":"` + strings.Repeat("x", maxProgressLine) + `"}}` + "\n" +
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":7,"progress":2}}` + "\n"
	for _, size := range []int{1, 7, 64, len(stream)} {
		var saw []string
		p := &progressScanner{r: strings.NewReader(""), saw: func(tok string) { saw = append(saw, tok) }}
		for i := 0; i < len(stream); i += size {
			p.feed([]byte(stream[i:min(i+size, len(stream))]))
		}
		require.Equal(t, []string{"a-1", "a-2", "7"}, saw, "chunks of %d", size)
	}
}

// TestProgressKeepsTheLastStepOverHTTP: the last step of a streamable HTTP
// server sending its steps right before its result is in the result.
func TestProgressKeepsTheLastStepOverHTTP(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "1.0.0"}, nil)
	srv.AddTool(&mcp.Tool{Name: "steps", InputSchema: map[string]any{"type": "object"}, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			for i := 1; i <= 5; i++ {
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: float64(i), Total: 5, Message: fmt.Sprintf("step %d", i)}); err != nil {
					return nil, err
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "stepped"}}}, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	r := newRig(t)
	r.start(t, ServerConfig{Name: "remote", URL: hs.URL})
	for i := 0; i < 3; i++ {
		res := decodeResult(t, r.result(t, r.dispatch(t, "remote_steps", "mcp_remote", `{}`, 0)))
		require.NotEmpty(t, res.Progress)
		require.EqualValues(t, 5, res.Progress[len(res.Progress)-1].Progress, "the last step is kept: %+v", res.Progress)
	}
}
