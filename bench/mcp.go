package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cgledger/cgledger/internal/auth"
)

// mcpAgent is the agent the MCP front door's calls are dispatched as.
// It has no roster entry: its wakeups are recorded as skipped, and the MCP
// client is answered from the report (docs/mcp.md).
const mcpAgent = "mcp"

// mcpTurnCalls is how many calls an MCP session (a turn) carries
// before the workload opens the next one, as the other workloads start a
// turn every hundred calls.
const mcpTurnCalls = 100

// mcpWorkload is the front door's workload: an MCP tools/call of echo
// through serve's /mcp (dispatch, the built-in echo, result card, report,
// the answer), beside its baseline, the same tools/call of an echo MCP
// server (Go SDK, in this process, streamable HTTP on loopback). Both go
// through the Go SDK's client.
type mcpWorkload struct {
	front, direct *mcpSessions
	srv           *http.Server
}

func newMCPWorkload(ctx context.Context, httpURL string, issue func(auth.Grant) (string, error)) (*mcpWorkload, error) {
	tok, err := issue(auth.Grant{Role: auth.RoleWorker, Project: "bench", Agent: mcpAgent})
	if err != nil {
		return nil, fmt.Errorf("mcp credential: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	echo := mcp.NewServer(&mcp.Implementation{Name: "bench-echo", Version: "1"}, nil)
	echo.AddTool(&mcp.Tool{Name: "echo", Description: "Returns its arguments.", InputSchema: map[string]any{"type": "object"}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(req.Params.Arguments)}}, StructuredContent: req.Params.Arguments}, nil
		})
	srv := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return echo }, nil), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	b := &mcpWorkload{srv: srv,
		front:  &mcpSessions{endpoint: httpURL + "/mcp/bench/" + mcpAgent, http: &http.Client{Transport: bearerTransport(tok)}},
		direct: &mcpSessions{endpoint: "http://" + ln.Addr().String() + "/", http: &http.Client{}},
	}
	// One call each before measuring: the session and echo's definition
	// are ready.
	if err := b.front.call(ctx); err != nil {
		b.close()
		return nil, fmt.Errorf("mcp front door: %w", err)
	}
	if err := b.direct.call(ctx); err != nil {
		b.close()
		return nil, fmt.Errorf("direct mcp: %w", err)
	}
	return b, nil
}

func (b *mcpWorkload) close() {
	b.front.close()
	b.direct.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.srv.Shutdown(ctx)
}

// mcpSessions calls echo on one MCP endpoint from any number of callers,
// in a session that is replaced every mcpTurnCalls calls.
type mcpSessions struct {
	endpoint string
	http     *http.Client

	mu    sync.Mutex
	cur   *mcp.ClientSession
	used  int
	older []*mcp.ClientSession
}

func (m *mcpSessions) session(ctx context.Context) (*mcp.ClientSession, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur == nil || m.used >= mcpTurnCalls {
		if m.cur != nil {
			// Closed at the end: callers may still be waiting in it.
			m.older = append(m.older, m.cur)
		}
		c := mcp.NewClient(&mcp.Implementation{Name: "cgledger-bench", Version: "1"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: m.endpoint, HTTPClient: m.http, DisableStandaloneSSE: true}, nil)
		if err != nil {
			return nil, err
		}
		m.cur, m.used = cs, 0
	}
	m.used++
	return m.cur, nil
}

// call is one tools/call of echo, answered without an error.
func (m *mcpSessions) call(ctx context.Context) error {
	cs, err := m.session(ctx)
	if err != nil {
		return err
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"n": 1}})
	if err != nil {
		return err
	}
	if res.IsError {
		return errors.New("echo answered isError")
	}
	return nil
}

func (m *mcpSessions) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, cs := range append(m.older, m.cur) {
		if cs != nil {
			_ = cs.Close()
		}
	}
	m.older, m.cur = nil, nil
}

// bearerTransport sends a bearer token with every request.
type bearerTransport string

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}
