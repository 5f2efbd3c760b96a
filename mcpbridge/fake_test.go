package mcpbridge

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeServer is a misbehaving MCP server on stdio (the Go SDK's, so that
// what it gets right is right): it lists a good tool, tools whose names no
// ledger tool may have, and tools that break the protocol when called:
// "garbage" writes a line that is not JSON-RPC on its standard output,
// "silent" never answers (and ignores cancellation).
func fakeServer(mode string) {
	s := mcp.NewServer(&mcp.Implementation{Name: "fake", Version: "1.0.0"}, nil)
	schema := map[string]any{"type": "object"}
	s.AddTool(&mcp.Tool{Name: "ok", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok from " + mode}}}, nil
		})
	s.AddTool(&mcp.Tool{Name: "getenv", Description: "the first getenv", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var args struct{ Name string }
			_ = json.Unmarshal(req.Params.Arguments, &args)
			v, ok := os.LookupEnv(args.Name)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%v:%s", ok, v)}}}, nil
		})
	for _, name := range []string{"bad name", "dotted.name", "echo"} {
		s.AddTool(&mcp.Tool{Name: name, InputSchema: schema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	}
	// steps sends its progress as fast as it can, right before its
	// result: the last step must be in the result.
	s.AddTool(&mcp.Tool{Name: "steps", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			for i := 1; i <= 5; i++ {
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: float64(i), Total: 5, Message: fmt.Sprintf("step %d", i)}); err != nil {
					return nil, err
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "stepped"}}}, nil
		})
	// huge answers more than a card holds.
	s.AddTool(&mcp.Tool{Name: "huge", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", 600<<10)}}}, nil
		})
	s.AddTool(&mcp.Tool{Name: "garbage", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			fmt.Fprintln(os.Stdout, "}}} this is not JSON-RPC {{{")
			select {}
		})
	s.AddTool(&mcp.Tool{Name: "silent", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			select {}
		})
	if mode == "dup" {
		// The SDK's server keeps one tool a name: a list with a name twice
		// is made after it, the copy saying so.
		s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				res, err := next(ctx, method, req)
				if lr, ok := res.(*mcp.ListToolsResult); ok && err == nil {
					for _, t := range lr.Tools {
						if t.Name == "getenv" {
							dup := *t
							dup.Description = "the second getenv"
							lr.Tools = append(lr.Tools, &dup)
							break
						}
					}
				}
				return res, err
			}
		})
	}
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "fake MCP server:", err)
		os.Exit(1)
	}
}
