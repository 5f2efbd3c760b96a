package mcpfront

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// DefaultMaxMessageBytes is the largest JSON-RPC message the front door
// reads, on stdio (one line) and over HTTP (one request body): 4 MiB, the
// SDK's own HTTP default, which holds a card's 512 KiB of arguments many
// times over.
const DefaultMaxMessageBytes = 4 << 20

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
		pending: map[string]bool{}, answered: make(chan struct{}, 1)}
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

func (c *stdioConn) Write(_ context.Context, msg jsonrpc.Message) error {
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return fmt.Errorf("mcpfront: encode message: %w", err)
	}
	c.wmu.Lock()
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
