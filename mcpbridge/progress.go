package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The SDK hands a server's notifications to the progress handler on a
// goroutine of their own, apart from the responses: a call's result can
// reach the bridge before the progress the server sent just before it
// (the last step, usually). So the bridge counts each call's progress
// notifications as their bytes arrive, before the SDK reads them, and
// after the result waits until its handler has seen as many: the record
// then ends with the server's last word.

// progressSettle bounds that wait: a notification counted on the wire but
// never handed over (one the SDK refused) delays the result this long at
// most.
const progressSettle = 2 * time.Second

// maxProgressLine is the longest line inspected for a progress
// notification; longer lines (results with data) are passed through
// unread.
const maxProgressLine = 64 << 10

// progressScanner passes a stream through and calls saw with the token of
// every progress notification in it: newline-delimited JSON-RPC (stdio) or
// server-sent events (a "data:" line each, streamable HTTP).
type progressScanner struct {
	r    io.Reader
	saw  func(token string)
	line []byte
	skip bool
}

func (p *progressScanner) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.feed(b[:n])
	return n, err
}

func (p *progressScanner) feed(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		chunk := b
		if i >= 0 {
			chunk = b[:i]
		}
		if !p.skip {
			if len(p.line)+len(chunk) > maxProgressLine {
				p.skip, p.line = true, p.line[:0]
			} else {
				p.line = append(p.line, chunk...)
			}
		}
		if i < 0 {
			return
		}
		if !p.skip {
			p.check(p.line)
		}
		p.line, p.skip = p.line[:0], false
		b = b[i+1:]
	}
}

func (p *progressScanner) check(line []byte) {
	line = bytes.TrimSpace(line)
	line = bytes.TrimSpace(bytes.TrimPrefix(line, []byte("data:")))
	if !bytes.Contains(line, []byte(`"notifications/progress"`)) {
		return
	}
	var m struct {
		Method string `json:"method"`
		Params struct {
			ProgressToken any `json:"progressToken"`
		} `json:"params"`
	}
	if json.Unmarshal(line, &m) != nil || m.Method != "notifications/progress" || m.Params.ProgressToken == nil {
		return
	}
	p.saw(fmt.Sprint(m.Params.ProgressToken))
}

// sawProgress counts a progress notification of a call in flight as it
// arrives on the wire.
func (s *server) sawProgress(tok string) {
	s.mu.Lock()
	if c := s.calls[tok]; c != nil {
		c.seen++
	}
	s.mu.Unlock()
}

// settleProgress waits until the progress handler has seen every
// notification of the call that arrived so far (at most progressSettle).
func (s *server) settleProgress(ctx context.Context, tok string) {
	t := time.NewTimer(progressSettle)
	defer t.Stop()
	for {
		s.mu.Lock()
		c := s.calls[tok]
		done := c == nil || c.handled >= c.seen
		ch := s.progressed
		s.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-t.C:
			s.b.log.Warn("MCP progress notifications counted but not handed over", "server", s.cfg.Name)
			return
		case <-ctx.Done():
			return
		}
	}
}

// progressTransport counts the progress notifications of the HTTP
// responses (event streams) as they are read.
type progressTransport struct {
	saw  func(string)
	next http.RoundTripper
}

func (p *progressTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := p.next.RoundTrip(r)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{&progressScanner{r: resp.Body, saw: p.saw}, resp.Body}
	return resp, nil
}

// stdioTransport is the SDK's CommandTransport with the server's standard
// output read through a progressScanner.
type stdioTransport struct {
	cmd       *exec.Cmd
	saw       func(string)
	terminate time.Duration
}

// Connect implements mcp.Transport.
func (t *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	stdout, err := t.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	stdin, err := t.cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	if err := t.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", t.cmd.Path, err)
	}
	// The connection is closed by closing the server's standard input,
	// not its output.
	return (&mcp.IOTransport{
		Reader: io.NopCloser(&progressScanner{r: stdout, saw: t.saw}),
		Writer: &processInput{WriteCloser: stdin, cmd: t.cmd, terminate: t.terminate},
	}).Connect(ctx)
}

// processInput is a stdio server's standard input; closing it ends the
// server as MCP's stdio transport says: close its input, wait, SIGTERM,
// wait, SIGKILL.
type processInput struct {
	io.WriteCloser
	cmd       *exec.Cmd
	terminate time.Duration
}

func (p *processInput) Close() error {
	if err := p.WriteCloser.Close(); err != nil && !errors.Is(err, io.ErrClosedPipe) && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("close stdin: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	wait := func() (error, bool) {
		t := time.NewTimer(p.terminate)
		defer t.Stop()
		select {
		case err := <-exited:
			return err, true
		case <-t.C:
			return nil, false
		}
	}
	if err, ok := wait(); ok {
		return err
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err == nil {
		if err, ok := wait(); ok {
			return err
		}
	}
	if err := p.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	if err, ok := wait(); ok {
		return err
	}
	return errors.New("the MCP server's process does not exit")
}
