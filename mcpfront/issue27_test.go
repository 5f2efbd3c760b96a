package mcpfront_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/mcpfront"
	"github.com/cgledger/cgledger/protocol"
)

// rawReply is one JSON-RPC answer as it came.
type rawReply struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *jsonrpc.Error  `json:"error"`
}

// rawStdio is a hand-driven stdio session, initialized.
type rawStdio struct {
	t     *testing.T
	w     io.Writer
	lines *bufio.Scanner
}

func newRawStdio(t *testing.T, f *mcpfront.Front, max int) *rawStdio {
	w, out := stdio(t, f, max)
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 4<<20), 4<<20)
	s := &rawStdio{t: t, w: w, lines: lines}
	s.send(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	require.Nil(t, s.next().Error)
	s.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return s
}

func (s *rawStdio) send(line string) {
	_, err := io.WriteString(s.w, line+"\n")
	require.NoError(s.t, err)
}

func (s *rawStdio) next() rawReply {
	require.True(s.t, s.lines.Scan(), "a reply")
	var rp rawReply
	require.NoError(s.t, json.Unmarshal(s.lines.Bytes(), &rp), s.lines.Text())
	return rp
}

func callResult(t *testing.T, rp rawReply) mcp.CallToolResult {
	t.Helper()
	require.Nil(t, rp.Error)
	var res mcp.CallToolResult
	require.NoError(t, json.Unmarshal(rp.Result, &res))
	return res
}

// F7: an id that is neither a string nor an integer would be read by the
// SDK as its integer part (5.7 as 5): refused, never keyed as another call.
func TestFractionalRequestIDRefused(t *testing.T) {
	r := newRig(t)
	s := newRawStdio(t, r.front(t, 0), 0)
	s.send(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"v":5}}}`)
	first := callResult(t, s.next())
	require.Equal(t, "rpc-5", first.Meta[mcpfront.MetaToolCallID])
	for _, id := range []string{"5.7", "5.0", "5e0", "9007199254740993"} {
		s.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"echo","arguments":{"v":"other"}}}`)
		rp := s.next()
		require.NotNil(t, rp.Error, id)
		require.EqualValues(t, jsonrpc.CodeInvalidRequest, rp.Error.Code, id)
		require.Contains(t, rp.Error.Message, id)
	}
	// A large integer a float64 holds exactly is an id like any other.
	s.send(`{"jsonrpc":"2.0","id":9007199254740992,"method":"tools/call","params":{"name":"echo","arguments":{}}}`)
	require.Equal(t, "rpc-9007199254740992", callResult(t, s.next()).Meta[mcpfront.MetaToolCallID])

	srv := httpFront(t, r, 0)
	h := newRawHTTP(t, srv.URL+"/mcp/proj/agent-1")
	status, body := h.post(`{"jsonrpc":"2.0","id":5.7,"method":"tools/call","params":{"name":"echo","arguments":{}}}`)
	require.Equal(t, http.StatusBadRequest, status, body)
	require.Contains(t, body, `"code":-32600`)
	require.Contains(t, body, "5.7")
}

// F3 over stdio: the same id again while the first request waits is
// answered at once with an error naming the id and how to ask; a new id
// with the call's tool_call_id asks for the same call, and both answers
// carry its one outcome.
func TestStdioSameIDInFlight(t *testing.T) {
	r := newRig(t)
	s := newRawStdio(t, r.front(t, 0), 0)
	call := `{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":1500}}}`
	s.send(call)
	s.send(call)
	rp := s.next()
	require.Equal(t, "77", string(rp.ID))
	require.NotNil(t, rp.Error, "the duplicate is answered while the first waits")
	require.EqualValues(t, jsonrpc.CodeInvalidRequest, rp.Error.Code)
	require.Contains(t, rp.Error.Message, "77")
	require.Contains(t, rp.Error.Message, "rpc-77")
	// The error comes from the transport, maybe before the first request
	// dispatched: the second asks once the call is on record.
	require.Eventually(t, func() bool {
		_, err := findCall(r, "rpc-77")
		return err == nil
	}, time.Minute, 20*time.Millisecond)
	s.send(`{"jsonrpc":"2.0","id":78,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":1500},"_meta":{"cgledger/tool_call_id":"rpc-77"}}}`)
	byID := map[string]mcp.CallToolResult{}
	for range 2 {
		rp := s.next()
		byID[string(rp.ID)] = callResult(t, rp)
	}
	require.Equal(t, "success", byID["77"].Meta[mcpfront.MetaStatus])
	require.Equal(t, byID["77"].Meta[mcpfront.MetaReportSeq], byID["78"].Meta[mcpfront.MetaReportSeq])
	require.Equal(t, true, byID["78"].Meta[mcpfront.MetaDuplicate])
	// Answered, the id is free again: asking with it is the same call.
	s.send(call)
	again := callResult(t, s.next())
	require.Equal(t, true, again.Meta[mcpfront.MetaDuplicate])
	require.Equal(t, byID["77"].Meta[mcpfront.MetaReportSeq], again.Meta[mcpfront.MetaReportSeq])
}

// rawHTTP is a hand-driven streamable HTTP session, initialized.
type rawHTTP struct {
	t       *testing.T
	url     string
	session string
}

func newRawHTTP(t *testing.T, url string) *rawHTTP {
	h := &rawHTTP{t: t, url: url}
	status, body := h.post(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	require.Equal(t, http.StatusOK, status, body)
	status, body = h.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	require.Equal(t, http.StatusAccepted, status, body)
	return h
}

func (h *rawHTTP) request(ctx context.Context, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, strings.NewReader(body))
	require.NoError(h.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if h.session != "" {
		req.Header.Set("Mcp-Session-Id", h.session)
	}
	return http.DefaultClient.Do(req)
}

func (h *rawHTTP) post(body string) (int, string) {
	resp, err := h.request(ledgertest.Ctx(h.t), body)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
		h.session = id
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// reply is the JSON-RPC answer in a body, plain JSON or the data of an SSE
// event.
func (h *rawHTTP) reply(body string) rawReply {
	for _, l := range strings.Split(body, "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok && strings.Contains(d, `"id"`) {
			body = d
		}
	}
	var rp rawReply
	require.NoError(h.t, json.Unmarshal([]byte(body), &rp), body)
	return rp
}

// F3 over HTTP: a dropped connection does not end the request (the stream
// stays resumable), so the same id again is the SDK's "duplicate in-flight";
// a new id with the call's tool_call_id gets the call's one outcome.
func TestHTTPAskAgainAfterDroppedStream(t *testing.T) {
	r := newRig(t)
	srv := httpFront(t, r, 0)
	h := newRawHTTP(t, srv.URL+"/mcp/proj/agent-1")
	call := `{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":3000}}}`
	ctx, drop := context.WithCancel(ledgertest.Ctx(t))
	resp, err := h.request(ctx, call)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	drop()
	resp.Body.Close()
	status, body := h.post(call)
	require.Equal(t, http.StatusBadRequest, status, body)
	rp := h.reply(body)
	require.EqualValues(t, jsonrpc.CodeInvalidRequest, rp.Error.Code)
	require.Contains(t, rp.Error.Message, "duplicate in-flight request ID 77")
	require.Eventually(t, func() bool {
		_, err := findCall(r, "rpc-77")
		return err == nil
	}, time.Minute, 20*time.Millisecond, "the first request dispatched")

	status, body = h.post(`{"jsonrpc":"2.0","id":78,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":3000},"_meta":{"cgledger/tool_call_id":"rpc-77"}}}`)
	require.Equal(t, http.StatusOK, status, body)
	res := callResult(t, h.reply(body))
	require.Equal(t, "success", res.Meta[mcpfront.MetaStatus])
	require.Equal(t, true, res.Meta[mcpfront.MetaDuplicate])
	require.Equal(t, "rpc-77", res.Meta[mcpfront.MetaToolCallID])
}

// F10: over HTTP, an unknown method and a request without an id are
// answered as JSON-RPC (the SDK answers plain text); over stdio a request
// without an id is answered -32600 (the SDK drops it).
func TestJSONRPCErrorsOnBothTransports(t *testing.T) {
	r := newRig(t)
	srv := httpFront(t, r, 0)
	h := newRawHTTP(t, srv.URL+"/mcp/proj/agent-1")
	status, body := h.post(`{"jsonrpc":"2.0","id":9,"method":"tools/fly","params":{}}`)
	require.Equal(t, http.StatusOK, status, body)
	rp := h.reply(body)
	require.Equal(t, "9", string(rp.ID))
	require.EqualValues(t, jsonrpc.CodeMethodNotFound, rp.Error.Code)
	status, body = h.post(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo","arguments":{}}}`)
	require.Equal(t, http.StatusBadRequest, status, body)
	rp = h.reply(body)
	require.Equal(t, "null", string(rp.ID))
	require.EqualValues(t, jsonrpc.CodeInvalidRequest, rp.Error.Code)
	require.Contains(t, rp.Error.Message, "needs an id")
	status, body = h.post(`{"jsonrpc":"2.0","method":"notifications/unheard-of"}`)
	require.Equal(t, http.StatusAccepted, status, body)

	s := newRawStdio(t, r.front(t, 0), 0)
	s.send(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo","arguments":{}}}`)
	rp = s.next()
	require.Equal(t, "null", string(rp.ID))
	require.EqualValues(t, jsonrpc.CodeInvalidRequest, rp.Error.Code)
	s.send(`{"jsonrpc":"2.0","id":10,"method":"tools/fly"}`)
	rp = s.next()
	require.Equal(t, "10", string(rp.ID))
	require.EqualValues(t, jsonrpc.CodeMethodNotFound, rp.Error.Code)
}

// F9: the Origin check comes before authentication.
func TestOriginGuardIsFirst(t *testing.T) {
	needsBearer := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) })
	srv := httptest.NewServer(mcpfront.OriginGuard(needsBearer))
	t.Cleanup(srv.Close)
	do := func(path, origin string) int {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader("{}"))
		require.NoError(t, err)
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, do("/mcp/proj/agent-1", "http://evil.example"))
	require.Equal(t, http.StatusUnauthorized, do("/mcp/proj/agent-1", ""))
	require.Equal(t, http.StatusUnauthorized, do("/mcp/proj/agent-1", "http://localhost:3000"))
	require.Equal(t, http.StatusUnauthorized, do("/v1/digest", "http://evil.example"), "only the front door's paths")
}

// F5: arguments the ledger's limits refuse are refused under the request's
// own field, arguments: on record when they reach the ledger, by the front
// door when they could not; a message over the front door's limit is
// refused as such.
func TestArgumentsOverTheLedgersLimits(t *testing.T) {
	r := newRig(t)
	s := newRawStdio(t, r.front(t, 0), 0)
	pad := func(n int) string {
		return `{"jsonrpc":"2.0","id":"big-` + string(rune('a'+n/(100<<10))) + `","method":"tools/call","params":{"name":"echo","arguments":{"pad":"` + strings.Repeat("x", n) + `"}}}`
	}
	type data struct {
		Violations   []protocol.Violation `json:"violations"`
		RejectionSeq uint64               `json:"rejection_seq"`
	}
	read := func(rp rawReply) data {
		require.NotNil(t, rp.Error)
		require.EqualValues(t, jsonrpc.CodeInvalidParams, rp.Error.Code, rp.Error.Message)
		var d data
		require.NoError(t, json.Unmarshal(rp.Error.Data, &d))
		require.NotEmpty(t, d.Violations)
		for _, v := range d.Violations {
			require.Equal(t, "arguments", v.Field, v.Message)
			require.Equal(t, protocol.VTooLarge, v.Code)
		}
		return d
	}
	s.send(pad(600 << 10)) // over a card's 512 KiB: the ledger's refusal
	require.NotZero(t, read(s.next()).RejectionSeq, "recorded")
	s.send(pad(900 << 10)) // over the ledger's request limit: the front door's
	require.Zero(t, read(s.next()).RejectionSeq, "not recorded")
	s.send(pad(mcpfront.DefaultMaxMessageBytes))
	rp := s.next()
	require.EqualValues(t, jsonrpc.CodeInvalidRequest, rp.Error.Code)
	require.Contains(t, rp.Error.Message, "longer than")
}

// F12 and F14: the result's own _meta reaches the client beside the
// front door's keys (which it cannot override); a call canceled by someone
// other than the client is said to be canceled, without guessing by whom.
func TestResultMetaAndCancelText(t *testing.T) {
	r := newRig(t)
	cs := goClient(t, r.front(t, 0), nil)
	ctx := ledgertest.Ctx(t)
	// echo's result is its arguments: MCP content with a _meta of its own.
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{
		"content": []any{map[string]any{"type": "text", "text": "hi"}},
		"_meta":   map[string]any{"example.com/trace": "t-1", mcpfront.MetaStatus: "forged", mcpfront.MetaDuplicate: true},
	}})
	require.NoError(t, err)
	require.Equal(t, "t-1", res.Meta["example.com/trace"])
	require.Equal(t, "success", res.Meta[mcpfront.MetaStatus])
	require.NotContains(t, res.Meta, mcpfront.MetaDuplicate)

	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sleep", Arguments: map[string]any{"ms": 60000},
			Meta: mcp.Meta{mcpfront.MetaToolCallID: "to-cancel"}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	var rec *protocol.CallRecord
	require.Eventually(t, func() bool {
		rec, err = findCall(r, "to-cancel")
		return err == nil
	}, time.Minute, 20*time.Millisecond)
	_, err = r.L.Cancel(ctx, protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: rec.AgentTurnID, ToolCallID: "to-cancel", Reason: "operator"})
	require.NoError(t, err)
	res = <-done
	require.NotNil(t, res)
	require.True(t, res.IsError)
	require.Equal(t, "canceled", res.Meta[mcpfront.MetaStatus])
	text := res.Content[0].(*mcp.TextContent).Text
	require.NotContains(t, text, "worker")
	require.Contains(t, text, "names who canceled it")
}

// F8: a turn id is the project's, not an agent's: another agent may
// dispatch into it (its call carries its own agent) but never gets, or
// changes, the first agent's call under the same ids.
func TestAnotherAgentsTurn(t *testing.T) {
	r := newRig(t)
	ctx := ledgertest.Ctx(t)
	alice := goClient(t, r.front(t, 0), nil)
	bobFront, err := mcpfront.New(mcpfront.Config{Project: project, Agent: "bob", Ledger: client.New(r.Srv.Connect(t), client.WithActor("bob")),
		Builtins: []*protocol.ToolDefinition{executor.EchoDefinition, executor.SleepDefinition}})
	require.NoError(t, err)
	bob := goClient(t, bobFront, nil)
	meta := func(call string) mcp.Meta {
		return mcp.Meta{mcpfront.MetaAgentTurnID: "t-shared", mcpfront.MetaToolCallID: call}
	}
	res, err := alice.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"secret": 1}, Meta: meta("k1")})
	require.NoError(t, err)
	require.False(t, res.IsError)

	_, err = bob.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"secret": 1}, Meta: meta("k1")})
	var rpcErr *jsonrpc.Error
	require.ErrorAs(t, err, &rpcErr)
	require.EqualValues(t, jsonrpc.CodeInvalidParams, rpcErr.Code)
	require.Contains(t, rpcErr.Message, "conflict")

	res, err = bob.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"own": 2}, Meta: meta("k2")})
	require.NoError(t, err)
	require.False(t, res.IsError)
	rec, err := r.L.GetCall(ctx, project, "t-shared", "k2")
	require.NoError(t, err)
	require.Equal(t, "bob", rec.AgentID)
	rec, err = r.L.GetCall(ctx, project, "t-shared", "k1")
	require.NoError(t, err)
	require.Equal(t, agent, rec.AgentID)
}

// A request the client canceled frees its id (the SDK still answers it),
// so the in-flight check never holds an id for good.
func TestStdioCanceledRequestFreesItsID(t *testing.T) {
	r := newRig(t)
	s := newRawStdio(t, r.front(t, 0), 0)
	s.send(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":60000}}}`)
	require.Eventually(t, func() bool {
		_, err := findCall(r, "rpc-5")
		return err == nil
	}, time.Minute, 20*time.Millisecond)
	s.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}`)
	rp := s.next()
	require.Equal(t, "5", string(rp.ID))
	s.send(`{"jsonrpc":"2.0","id":5,"method":"tools/list"}`)
	rp = s.next()
	require.Equal(t, "5", string(rp.ID))
	require.Nil(t, rp.Error)
}
