package mcpbridge

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestStreamableHTTPAuthAndListChanged: a streamable HTTP server (the Go
// SDK's, on loopback) that wants an auth header gets it from the variable
// auth_env names, and the value is written nowhere in the ledger nor the
// logs. A tool added or changed on the server
// (notifications/tools/list_changed) is registered, the changed one as a
// new version, and calls reach it.
func TestStreamableHTTPAuthAndListChanged(t *testing.T) {
	const secret = "Bearer s3cr3t-token-never-recorded"
	srv := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "2.1.0"}, nil)
	schema := map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}
	srv.AddTool(&mcp.Tool{Name: "lookup", Description: "first", InputSchema: schema, Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "found " + string(req.Params.Arguments)}}}, nil
		})
	var refused atomic.Int32
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != secret {
			refused.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)

	r := newRig(t)
	b, err := New(&Config{Project: "proj", Servers: []ServerConfig{{Name: "remote", URL: hs.URL, AuthEnv: "REMOTE_KEY", AuthHeader: "X-Api-Key"}}}, Deps{
		Registrar: r.L,
		Ledger:    r.ledgerFor,
		Logger:    r.logger(),
		LookupEnv: func(k string) (string, bool) {
			if k == "REMOTE_KEY" {
				return secret, true
			}
			return "", false
		},
	})
	require.NoError(t, err)
	require.NoError(t, b.Start(ledgertest.Ctx(t)))
	t.Cleanup(func() { b.Stop(context.Background()) })

	st, err := r.L.GetTool(ledgertest.Ctx(t), "proj", "remote_lookup")
	require.NoError(t, err)
	require.Equal(t, protocol.DeterminismIdempotent, st.Definition.Determinism)
	require.True(t, strings.HasPrefix(st.Definition.Version, "2.1.0+mcp."), st.Definition.Version)
	first := st.Seq

	res := decodeResult(t, r.result(t, r.dispatch(t, "remote_lookup", "mcp_remote", `{"q":"nats"}`, 0)))
	require.Contains(t, res.Content[0]["text"], "nats")

	// Added and changed while connected.
	srv.AddTool(&mcp.Tool{Name: "more", InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "more"}}}, nil
		})
	srv.AddTool(&mcp.Tool{Name: "lookup", Description: "second", InputSchema: schema, Annotations: &mcp.ToolAnnotations{IdempotentHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "second version"}}}, nil
		})
	require.Eventually(t, func() bool {
		st, err := r.L.GetTool(context.Background(), "proj", "remote_lookup")
		_, merr := r.L.GetTool(context.Background(), "proj", "remote_more")
		return err == nil && st.Definition.Description == "second" && merr == nil
	}, time.Minute, 20*time.Millisecond, "re-registered after tools/list_changed")
	st, err = r.L.GetTool(ledgertest.Ctx(t), "proj", "remote_lookup")
	require.NoError(t, err)
	require.Greater(t, st.Seq, first)
	require.NotEqual(t, "", st.Definition.Version)
	res = decodeResult(t, r.result(t, r.dispatch(t, "remote_more", "mcp_remote", `{}`, 0)))
	require.Equal(t, "more", res.Content[0]["text"])

	require.Zero(t, refused.Load(), "every request carried the header")
	_, err = r.L.ReadEntries(ledgertest.Ctx(t), 1, func(e protocol.Entry) error {
		require.NotContains(t, string(e.Data), "s3cr3t")
		for _, vs := range e.Headers {
			for _, v := range vs {
				require.NotContains(t, v, "s3cr3t")
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.NotContains(t, r.logs.String(), "s3cr3t")
}

// TestStreamableHTTPServerRestart: an HTTP server that goes away is
// reconnected with backoff once it is back; meanwhile calls fail fast with
// S-TOOL-UNAVAILABLE.
func TestStreamableHTTPServerRestart(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "1.0.0"}, nil)
	srv.AddTool(&mcp.Tool{Name: "ping", InputSchema: map[string]any{"type": "object"}, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil
		})
	serve := func(ln net.Listener) *http.Server {
		hs := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)}
		go func() { _ = hs.Serve(ln) }()
		return hs
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	hs := serve(ln)

	r := newRig(t)
	r.start(t, ServerConfig{Name: "remote", URL: "http://" + addr, RestartMinMS: 200, RestartMaxMS: 1000})
	require.Equal(t, "pong", decodeResult(t, r.result(t, r.dispatch(t, "remote_ping", "mcp_remote", `{}`, 0))).Content[0]["text"])

	require.NoError(t, hs.Close())
	require.Eventually(t, func() bool {
		tr := r.result(t, r.dispatch(t, "remote_ping", "mcp_remote", `{}`, 0))
		return tr.Status == protocol.StatusFailed && errDetail(t, tr).TaxonomyCode == protocol.CodeToolUnavailable
	}, time.Minute, 50*time.Millisecond, "calls fail fast while the server is away")

	ln, err = net.Listen("tcp", addr)
	require.NoError(t, err)
	hs = serve(ln)
	t.Cleanup(func() { _ = hs.Close() })
	require.Eventually(t, func() bool {
		return r.result(t, r.dispatch(t, "remote_ping", "mcp_remote", `{}`, 0)).Status == protocol.StatusSuccess
	}, time.Minute, 100*time.Millisecond, "served again after the reconnect")
	require.Contains(t, r.logs.String(), "MCP server restarted")
}

// TestServerUnreachableAtStart: a server nobody answers at start does not
// fail the bridge: the other servers serve, it is retried with backoff
// (logged), its tools registered earlier fail fast with
// S-TOOL-UNAVAILABLE meanwhile, and once it answers its tools are
// registered and served. With FailUnreachable (the standalone bridge)
// Start fails with ErrServerUnreachable instead.
func TestServerUnreachableAtStart(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "late", Version: "1.0.0"}, nil)
	srv.AddTool(&mcp.Tool{Name: "ping", InputSchema: map[string]any{"type": "object"}, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil
		})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	late := ServerConfig{Name: "late", URL: "http://" + addr, RestartMinMS: 100, RestartMaxMS: 500, ConnectTimeoutMS: 5000}
	// fresh has no tool registered by an earlier run: the ledger keeps no
	// consumer for its target until its first listing.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	freshAddr := ln.Addr().String()
	require.NoError(t, ln.Close())
	fresh := ServerConfig{Name: "fresh", URL: "http://" + freshAddr, RestartMinMS: 100, RestartMaxMS: 500, ConnectTimeoutMS: 5000}

	r := newRig(t)
	strict, err := New(&Config{Project: "proj", Servers: []ServerConfig{late}}, Deps{Registrar: r.L, Ledger: r.ledgerFor, Logger: r.logger(), FailUnreachable: true})
	require.NoError(t, err)
	err = strict.Start(ledgertest.Ctx(t))
	require.ErrorIs(t, err, ErrServerUnreachable)

	// A registration of an earlier run is kept.
	_, err = r.L.RegisterTool(ledgertest.Ctx(t), &protocol.ToolDefinition{ProjectID: "proj", ToolName: "late_ping", Parameters: []byte(`{"type":"object"}`),
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.mcp_late", AfterExecution: protocol.AfterSuspend, Determinism: protocol.DeterminismPure})
	require.NoError(t, err)
	b := r.start(t, late, fresh, fakeCommand(t))
	require.Contains(t, b.Tools()["fake"], "ok", "the other server serves")
	require.Empty(t, b.Tools()["late"])
	require.Equal(t, "ok from bad", decodeResult(t, r.result(t, r.dispatch(t, "ok", "mcp_fake", `{}`, 0))).Content[0]["text"])
	tr := r.result(t, r.dispatch(t, "late_ping", "mcp_late", `{}`, 0))
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, protocol.CodeToolUnavailable, errDetail(t, tr).TaxonomyCode)
	require.Eventually(t, func() bool { return strings.Contains(r.logs.String(), "MCP server restart failed") }, time.Minute, 20*time.Millisecond)

	for _, a := range []string{addr, freshAddr} {
		l, err := net.Listen("tcp", a)
		require.NoError(t, err)
		hs := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)}
		go func() { _ = hs.Serve(l) }()
		t.Cleanup(func() { _ = hs.Close() })
	}
	require.Eventually(t, func() bool { return len(b.Tools()["late"]) == 1 && len(b.Tools()["fresh"]) == 1 }, time.Minute, 50*time.Millisecond, "registered once it answers")
	require.Equal(t, "pong", decodeResult(t, r.result(t, r.dispatch(t, "late_ping", "mcp_late", `{}`, 0))).Content[0]["text"])
	require.Equal(t, "pong", decodeResult(t, r.result(t, r.dispatch(t, "fresh_ping", "mcp_fresh", `{}`, 0))).Content[0]["text"])
}
