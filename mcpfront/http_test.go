package mcpfront_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/mcpfront"
	"github.com/cgledger/cgledger/protocol"
)

func httpFront(t *testing.T, r *rig, max int64, closeAfter ...time.Duration) *httptest.Server {
	t.Helper()
	nc := r.Srv.Connect(t)
	cfg := mcpfront.HTTPConfig{
		Ledger:          func(_, a string) mcpfront.Ledger { return client.New(nc, client.WithActor(a)) },
		Builtins:        []*protocol.ToolDefinition{executor.EchoDefinition, executor.SleepDefinition},
		MaxMessageBytes: max,
	}
	if len(closeAfter) > 0 {
		cfg.CloseStreamAfter = closeAfter[0]
	}
	h := mcpfront.Handler(cfg)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func TestHTTPGoClient(t *testing.T) {
	r := newRig(t)
	srv := httpFront(t, r, 0)
	ctx := ledgertest.Ctx(t)
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp/proj/agent-1"}, nil)
	require.NoError(t, err)
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"via": "http"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	// The session is the turn; the JSON-RPC id keys the call.
	require.Equal(t, cs.ID(), res.Meta[mcpfront.MetaAgentTurnID])
	callID := res.Meta[mcpfront.MetaToolCallID].(string)
	require.True(t, strings.HasPrefix(callID, "rpc-"), callID)
	rec, err := r.L.GetCall(ctx, project, cs.ID(), callID)
	require.NoError(t, err)
	require.Equal(t, agent, rec.AgentID)
}

// TestHTTPStreamPolling: a call that outlives its stream (the front door
// ends it after CloseStreamAfter) is answered on the stream the client
// resumes.
func TestHTTPStreamPolling(t *testing.T) {
	r := newRig(t)
	srv := httpFront(t, r, 0, 100*time.Millisecond)
	ctx := ledgertest.Ctx(t)
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp/proj/agent-1"}, nil)
	require.NoError(t, err)
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sleep", Arguments: map[string]any{"ms": 800}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Equal(t, "success", res.Meta[mcpfront.MetaStatus])
}

func TestHTTPRefusals(t *testing.T) {
	r := newRig(t)
	srv := httpFront(t, r, 2048)
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	post := func(path, body string, hdr map[string]string) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
				continue
			}
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, _ := post("/mcp/proj/agent-1", init, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	resp, body := post("/mcp/proj/agent-1", init, map[string]string{"Origin": "http://evil.example.com"})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, body)
	resp, body = post("/mcp/proj/agent-1", init, map[string]string{"Host": "evil.example.com"})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, body)

	resp, body = post("/mcp/proj/agent-1", `{"jsonrpc":"2.0","id":2,"method":"ping","params":{"pad":"`+strings.Repeat("x", 3000)+`"}}`, nil)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, body)
	require.Contains(t, body, "2048")

	resp, body = post("/mcp/a.b/_", init, nil)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	var p struct {
		Violations []protocol.Violation `json:"violations"`
	}
	require.NoError(t, json.NewDecoder(bytes.NewReader([]byte(body))).Decode(&p))
	require.Len(t, p.Violations, 2, body)

	resp, body = post("/mcp/proj/agent-1", `{"jsonrpc":"2.0","id":3,`, nil)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
}

// TestHTTPWakeup: the HTTP front door's endpoints hear their agent's
// wakeups too: a 2.5 s call is read at dispatch, on its wakeup and by a few
// fallback polls (polling alone reads it ten times).
func TestHTTPWakeup(t *testing.T) {
	r := newRig(t)
	nc := r.Srv.Connect(t)
	var cl atomic.Pointer[countingLedger]
	h := mcpfront.Handler(mcpfront.HTTPConfig{
		Ledger: func(_, a string) mcpfront.Ledger {
			c := &countingLedger{Client: client.New(nc, client.WithActor(a))}
			cl.Store(c)
			return c
		},
		Subscribe: func(subject string, fn func([]byte)) (func(), error) {
			sub, err := nc.Subscribe(subject, func(m *nats.Msg) { fn(m.Data) })
			if err != nil {
				return nil, err
			}
			return func() { _ = sub.Unsubscribe() }, nil
		},
		Builtins: []*protocol.ToolDefinition{executor.EchoDefinition, executor.SleepDefinition},
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx := ledgertest.Ctx(t)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp/proj/agent-1"}, nil)
	require.NoError(t, err)
	defer cs.Close()
	sleepCall(t, cs, "http-wake", 2500)
	require.LessOrEqual(t, cl.Load().reads.Load(), int64(6), "the call is answered on its wakeup, not by polling")
	ro, err := r.cl.GetRoster(ctx, project, agent)
	require.NoError(t, err)
	require.Equal(t, agent, ro.WorkerTarget)
}
