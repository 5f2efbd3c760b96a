package mcpfront

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// DefaultMaxMessageBytes is the largest JSON-RPC message the front door
// reads, on stdio (one line) and over HTTP (one request body): 1 MiB, NATS's
// default max_payload. A tools/call's arguments then always reach the
// ledger (which refuses, and records, a dispatch over its request limit,
// protocol.MaxRequestBytes) or are refused by the front door itself as too
// large (MaxArgumentsBytes); a larger limit would let arguments through that
// NATS cannot carry to the ledger at all.
const DefaultMaxMessageBytes = 1 << 20

// requestIDProblem says why a message's id cannot key a call, or "": MCP
// ids are strings or integers, and the SDK reads a number as a float64 and
// keeps its integer part, so 5.7 (or 5.0, or an integer beyond 2^53) would
// be answered, and keyed, as another id. raw is the message.
func requestIDProblem(raw []byte) string {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(raw, &m) != nil || len(m.ID) == 0 || m.ID[0] == '"' || string(m.ID) == "null" {
		return ""
	}
	n, err := strconv.ParseInt(string(m.ID), 10, 64)
	if err != nil || int64(float64(n)) != n {
		return fmt.Sprintf("request id %s refused: an MCP request id is a string or an integer (at most 2^53 in magnitude, as JSON numbers are read)", m.ID)
	}
	return ""
}

// requestMethods are the requests (which need an id) and notifications the
// SDK's server reads (its serverMethodInfos): the transports answer a
// request for any other method, or one of these without its id, with a
// JSON-RPC error themselves, where the SDK's HTTP transport answers plain
// text and its session drops an id-less request unanswered.
var requestMethods = map[string]bool{
	"completion/complete": true, "server/discover": true, "initialize": true, "ping": true,
	"prompts/list": true, "prompts/get": true, "tools/list": true, "tools/call": true,
	"resources/list": true, "resources/templates/list": true, "resources/read": true,
	"logging/setLevel": true, "resources/subscribe": true, "subscriptions/listen": true, "resources/unsubscribe": true,
}

var notificationMethods = map[string]bool{
	"notifications/cancelled": true, "notifications/initialized": true,
	"notifications/roots/list_changed": true, "notifications/progress": true,
}

// methodProblem is the JSON-RPC error for a request the SDK would not
// answer as JSON-RPC: an unknown method called with an id (-32601, answered
// under that id), or a request method sent without one (-32600, id null).
// unknownNotification is true for a notification of an unknown method,
// which JSON-RPC answers with nothing.
func methodProblem(msg jsonrpc.Message) (rpcErr *jsonrpc.Error, unknownNotification bool) {
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return nil, false
	}
	switch {
	case requestMethods[req.Method] && !req.ID.IsValid():
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: fmt.Sprintf("%s is a request: it needs an id (a string or an integer); sent without one it is not answered otherwise", req.Method)}, false
	case requestMethods[req.Method] || notificationMethods[req.Method]:
		return nil, false
	case req.ID.IsValid():
		return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("method %q not found", req.Method)}, false
	}
	return nil, true
}

// withRequestID writes the request's JSON-RPC id into _meta of a tools/call
// (MetaRequestID, replacing whatever the client put there), so the handler
// can key the call by it. Other messages are returned as they are.
func withRequestID(msg jsonrpc.Message) jsonrpc.Message {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || req.Method != "tools/call" || !req.ID.IsValid() {
		return msg
	}
	id, ok := requestIDMeta(req.ID)
	if !ok {
		return msg
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(req.Params, &params); err != nil || params == nil {
		// The SDK refuses such params with its own error.
		return msg
	}
	meta := map[string]any{}
	if raw, ok := params["_meta"]; ok {
		if err := json.Unmarshal(raw, &meta); err != nil || meta == nil {
			return msg
		}
	}
	meta[MetaRequestID] = id
	b, err := json.Marshal(meta)
	if err != nil {
		return msg
	}
	params["_meta"] = b
	p, err := json.Marshal(params)
	if err != nil {
		return msg
	}
	out := *req
	out.Params = p
	return &out
}

// StdioTransport is the front door's transport over a byte stream (stdin
// and stdout of `cgledger mcp serve`): newline-delimited JSON-RPC as MCP's
// stdio transport has it, read with a limit, and, unlike the SDK's own, a
// line that is not JSON-RPC (or too long, or a batch) is answered with a
// JSON-RPC error and the session goes on. When the input ends, the session
// ends only once every request read is answered (a client that writes its
// calls and closes its end still gets their answers), or when the context
// of Run is done.
type StdioTransport struct {
	In  io.Reader
	Out io.Writer
	// MaxMessageBytes bounds one line; DefaultMaxMessageBytes when zero.
	MaxMessageBytes int
}

// Connect implements mcp.Transport.
func (t *StdioTransport) Connect(context.Context) (mcp.Connection, error) {
	limit := t.MaxMessageBytes
	if limit <= 0 {
		limit = DefaultMaxMessageBytes
	}
	c := &stdioConn{r: bufio.NewReaderSize(t.In, 64<<10), w: t.Out, limit: limit, closed: make(chan struct{}), lines: make(chan lineOrErr),
		pending: map[string]bool{}, answered: make(chan struct{}, 1), inflight: map[jsonrpc.ID]bool{}}
	go c.readLoop()
	return c, nil
}

type lineOrErr struct {
	line []byte
	err  error
}

type stdioConn struct {
	r     *bufio.Reader
	limit int

	wmu sync.Mutex
	w   io.Writer

	lines     chan lineOrErr
	closeOnce sync.Once
	closed    chan struct{}

	// pending are the requests read and not yet answered, by id; answered
	// is signalled each time one is.
	pmu      sync.Mutex
	pending  map[string]bool
	answered chan struct{}
	// inflight are the ids of requests read and not yet answered (under
	// wmu): a second request with one of them is answered with an error
	// naming it, where the SDK would drop it unanswered.
	inflight map[jsonrpc.ID]bool
}

// idKey is a request id as a key: the number 7 and the string "7" apart.
func idKey(id jsonrpc.ID) string { return fmt.Sprintf("%T:%v", id.Raw(), id.Raw()) }

// track notes a request read (it waits for its answer), and forgets one
// the client cancelled (its answer may never be sent).
func (c *stdioConn) track(msg jsonrpc.Message) {
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return
	}
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if req.ID.IsValid() {
		c.pending[idKey(req.ID)] = true
		return
	}
	if req.Method != "notifications/cancelled" {
		return
	}
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(req.Params, &p) != nil {
		return
	}
	if id, err := jsonrpc.MakeID(p.RequestID); err == nil {
		delete(c.pending, idKey(id))
		c.signal()
	}
}

// signal wakes drain; pmu is held.
func (c *stdioConn) signal() {
	select {
	case c.answered <- struct{}{}:
	default:
	}
}

// drain waits, after the input ended, until every request read is
// answered: the calls in flight finish (each within its deadline and the
// front door's ReportWaitGrace) and reach the client before the session
// ends.
func (c *stdioConn) drain(ctx context.Context) {
	for {
		c.pmu.Lock()
		n := len(c.pending)
		c.pmu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-c.closed:
			return
		case <-c.answered:
		}
	}
}

// readLoop reads lines for Read: a blocked read of the input must not keep
// Read from returning when the session closes.
func (c *stdioConn) readLoop() {
	for {
		line, err := c.readLine()
		select {
		case c.lines <- lineOrErr{line, err}:
		case <-c.closed:
			return
		}
		if err != nil && !errors.Is(err, errTooLong) {
			return
		}
	}
}

var errTooLong = errors.New("message too long")

// readLine reads one line of at most limit bytes; a longer one is read to
// its end and dropped (errTooLong).
func (c *stdioConn) readLine() ([]byte, error) {
	var buf []byte
	tooLong := false
	for {
		chunk, err := c.r.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > c.limit+1 {
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch {
		case err == nil:
			if tooLong {
				return nil, errTooLong
			}
			return buf, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > 0 && !tooLong:
			return buf, nil
		default:
			return nil, err
		}
	}
}

func (c *stdioConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		var l lineOrErr
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closed:
			return nil, io.EOF
		case l = <-c.lines:
		}
		if errors.Is(l.err, errTooLong) {
			c.refuse(jsonrpc.CodeInvalidRequest, fmt.Sprintf("message longer than %d bytes refused (the front door's limit)", c.limit))
			continue
		}
		if l.err != nil {
			c.drain(ctx)
			return nil, l.err
		}
		line := bytes.TrimSpace(l.line)
		if len(line) == 0 {
			continue
		}
		if line[0] == '[' {
			c.refuse(jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not accepted: send one message a line")
			continue
		}
		msg, err := jsonrpc.DecodeMessage(line)
		if err != nil {
			code := int64(jsonrpc.CodeParseError)
			if json.Valid(line) {
				code = jsonrpc.CodeInvalidRequest
			}
			c.refuse(code, "not a JSON-RPC 2.0 message: "+err.Error())
			continue
		}
		if why := requestIDProblem(line); why != "" {
			c.refuse(jsonrpc.CodeInvalidRequest, why)
			continue
		}
		if rpcErr, _ := methodProblem(msg); rpcErr != nil {
			c.answer(msg.(*jsonrpc.Request).ID, rpcErr)
			continue
		}
		if c.duplicate(msg) {
			continue
		}
		c.track(msg)
		return withRequestID(msg), nil
	}
}

// refuse answers a line that is no message: id null, as JSON-RPC has it
// for a request whose id cannot be read.
func (c *stdioConn) refuse(code int64, msg string) {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": code, "message": msg}})
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = c.w.Write(append(b, '\n'))
}

// answer writes a JSON-RPC error under id (null when id is not valid).
func (c *stdioConn) answer(id jsonrpc.ID, rpcErr *jsonrpc.Error) {
	b, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: rpcErr})
	if err != nil || !id.IsValid() {
		// The SDK's encoding leaves out an id it does not have; JSON-RPC
		// wants it null.
		c.refuse(rpcErr.Code, rpcErr.Message)
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = c.w.Write(append(b, '\n'))
}

// duplicate answers, and reports, a request whose id is in flight: asking
// again while the first request still waits gets an error naming the id,
// and the first request's answer still comes (a new id with
// _meta["cgledger/tool_call_id"] asks for the same call alongside it).
func (c *stdioConn) duplicate(msg jsonrpc.Message) bool {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || !req.ID.IsValid() {
		return false
	}
	c.wmu.Lock()
	dup := c.inflight[req.ID]
	c.inflight[req.ID] = true
	c.wmu.Unlock()
	if !dup {
		return false
	}
	raw, _ := json.Marshal(req.ID.Raw())
	text := fmt.Sprintf("request id %s is in flight: its answer is still to come", raw)
	if req.Method == "tools/call" {
		text = fmt.Sprintf("request id %s is in flight: its answer comes when the call reports; to ask for the same call meanwhile, use a new id with _meta[%q] = %q (or the %s the first request gave)",
			raw, MetaToolCallID, ToolCallIDFromRequestID(raw), MetaToolCallID)
	}
	c.answer(req.ID, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: text})
	return true
}

func (c *stdioConn) Write(_ context.Context, msg jsonrpc.Message) error {
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return fmt.Errorf("mcpfront: encode message: %w", err)
	}
	c.wmu.Lock()
	if resp, ok := msg.(*jsonrpc.Response); ok {
		delete(c.inflight, resp.ID)
	}
	_, err = c.w.Write(append(b, '\n'))
	c.wmu.Unlock()
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.pmu.Lock()
		delete(c.pending, idKey(resp.ID))
		c.signal()
		c.pmu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("mcpfront: write message: %w", err)
	}
	return nil
}

func (c *stdioConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

func (c *stdioConn) SessionID() string { return "" }
