package mcpbridge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/protocol"
)

// server is one MCP server: its session (nil while down), the ledger names
// of its tools, and the executor serving its target.
type server struct {
	b   *Bridge
	cfg *ServerConfig

	// exMu guards ex, the executor of the target (nil until started).
	exMu sync.Mutex
	ex   *executor.Executor

	mu    sync.Mutex
	sess  *mcp.ClientSession
	names map[string]string // ledger tool name -> MCP tool name
	// calls maps the progress token of each call in flight to it.
	calls map[string]*inflight
	// progressed is closed (and replaced) when a call's progress was
	// handed to it: settleProgress waits on it.
	progressed chan struct{}

	// cmd is the stdio server's process of the latest connection.
	cmd *exec.Cmd

	tokens atomic.Uint64
	relist chan struct{}
}

func newServer(b *Bridge, cfg *ServerConfig) *server {
	return &server{b: b, cfg: cfg, names: map[string]string{}, calls: map[string]*inflight{}, progressed: make(chan struct{}), relist: make(chan struct{}, 1)}
}

// inflight is a call in flight and its progress notifications: seen on
// the wire, handed over by the SDK (both under server.mu).
type inflight struct {
	call          *executor.Call
	seen, handled int
}

// start connects and registers the tools (or, when the server cannot be
// reached and the bridge is not strict, leaves that to supervise), starts
// the executor on the target's consumer and supervises the session. The
// ledger keeps that consumer only for a target some registered tool has:
// when none has yet (the server was never listed), the executor starts
// once supervise has registered the tools.
func (s *server) start(ctx, runCtx context.Context) error {
	sess, err := s.connectAndRegister(ctx)
	if err != nil {
		if s.b.deps.FailUnreachable || ctx.Err() != nil {
			return err
		}
		s.b.log.Warn("MCP server unreachable at start; retrying with backoff", "server", s.cfg.Name, "err", err, "backoff", time.Duration(s.cfg.RestartMinMS)*time.Millisecond)
		sess = nil
	}
	s.mu.Lock()
	s.sess = sess
	s.mu.Unlock()
	if err := s.startExecutor(ctx); err != nil {
		if e, ok := protocol.AsError(err); !ok || sess != nil || e.Code != protocol.CodeNotFound {
			s.closeSession()
			return err
		}
		s.b.log.Info("MCP server's executor waits for its tools' first registration", "server", s.cfg.Name, "target", s.cfg.Target)
	}
	s.b.wg.Add(2)
	go func() { defer s.b.wg.Done(); s.supervise(runCtx, sess) }()
	go func() { defer s.b.wg.Done(); s.relister(runCtx) }()
	return nil
}

// errStopping: the bridge is stopping, no executor starts.
var errStopping = errors.New("mcpbridge: stopping")

// startExecutor starts the executor on the target's consumer unless it
// runs already. exMu is held throughout, so that Stop either sees the
// executor or keeps it from starting.
func (s *server) startExecutor(ctx context.Context) error {
	s.exMu.Lock()
	defer s.exMu.Unlock()
	if s.ex != nil {
		return nil
	}
	if s.b.stopping.Load() {
		return errStopping
	}
	l, nc, err := s.b.deps.Ledger(s.cfg.Target)
	if err != nil {
		return fmt.Errorf("ledger for target %s: %w", s.cfg.Target, err)
	}
	ecfg := s.b.deps.Executor
	ecfg.Bindings = []executor.Binding{{Project: s.b.cfg.Project, Tool: s.cfg.Target}}
	if ecfg.Logger == nil {
		ecfg.Logger = s.b.log
	}
	ex, err := executor.New(l, nc, ecfg)
	if err != nil {
		return err
	}
	if err := ex.Register(s.cfg.Target, s, nil); err != nil {
		return err
	}
	if err := ex.Start(ctx); err != nil {
		return err
	}
	s.ex = ex
	return nil
}

// stopExecutor drains the executor, if it runs.
func (s *server) stopExecutor(ctx context.Context) {
	s.exMu.Lock()
	ex := s.ex
	s.exMu.Unlock()
	if ex != nil {
		ex.Stop(ctx)
	}
}

// connectAndRegister connects to the server and registers its tools. A
// server that cannot be started, reached, initialized or listed is
// ErrServerUnreachable; what the ledger does not do is not.
func (s *server) connectAndRegister(ctx context.Context) (*mcp.ClientSession, error) {
	sess, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrServerUnreachable, err)
	}
	if err := s.register(ctx, sess); err != nil {
		_ = sess.Close()
		return nil, err
	}
	return sess, nil
}

// connect starts (stdio) or reaches (HTTP) the server and initializes a
// session, within the connect timeout.
func (s *server) connect(ctx context.Context) (*mcp.ClientSession, error) {
	var t mcp.Transport
	if len(s.cfg.Command) > 0 {
		cmd := exec.Command(s.cfg.Command[0], s.cfg.Command[1:]...)
		cmd.Env = childEnv(s.cfg.InheritEnv)
		for k, v := range s.cfg.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		// The server's diagnostics go to the bridge's standard error,
		// never into the ledger.
		cmd.Stderr = os.Stderr
		t = &stdioTransport{cmd: cmd, saw: s.sawProgress, terminate: 2 * time.Second}
		s.mu.Lock()
		s.cmd = cmd
		s.mu.Unlock()
	} else {
		var rt http.RoundTripper = http.DefaultTransport
		if s.cfg.AuthEnv != "" {
			v, ok := s.b.deps.LookupEnv(s.cfg.AuthEnv)
			if !ok || v == "" {
				return nil, fmt.Errorf("auth_env %s is unset or empty", s.cfg.AuthEnv)
			}
			rt = &authTransport{header: s.cfg.AuthHeader, value: v, next: rt}
		}
		hc := &http.Client{Transport: &progressTransport{saw: s.sawProgress, next: rt}}
		// The SDK's own reconnects (5) ride out a dropped event stream;
		// a server gone for longer ends the session, and supervise
		// restarts it.
		t = &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: hc}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "cgledger-mcp-bridge", Version: "1.0.0"}, &mcp.ClientOptions{
		Capabilities:                &mcp.ClientCapabilities{},
		ToolListChangedHandler:      func(context.Context, *mcp.ToolListChangedRequest) { s.askRelist() },
		ProgressNotificationHandler: s.onProgress,
	})
	cctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.ConnectTimeoutMS)*time.Millisecond)
	defer cancel()
	sess, err := client.Connect(cctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return sess, nil
}

// inheritedEnv are the variables a stdio server gets from the bridge's
// environment by default (as the official TypeScript SDK's stdio client
// does): enough to find and run a program, nothing of the bridge's own
// secrets (CGLEDGER_NATS_PASSWORD, an HTTP server's auth variable...).
var inheritedEnv = []string{"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "TMPDIR", "LANG", "LC_ALL", "SYSTEMROOT"}

// childEnv is the inherited part of a stdio server's environment.
func childEnv(extra []string) []string {
	var env []string
	for _, k := range append(append([]string(nil), inheritedEnv...), extra...) {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// authTransport adds the configured auth header to every request.
type authTransport struct {
	header, value string
	next          http.RoundTripper
}

func (a *authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(a.header, a.value)
	return a.next.RoundTrip(r)
}

// supervise waits for the session to end and restarts the server with
// backoff; while it is down the session is nil and calls fail fast. A nil
// sess (unreachable at start) starts with the restarts.
func (s *server) supervise(ctx context.Context, sess *mcp.ClientSession) {
	minB := time.Duration(s.cfg.RestartMinMS) * time.Millisecond
	maxB := time.Duration(s.cfg.RestartMaxMS) * time.Millisecond
	wait := minB
	for {
		if sess != nil {
			up := time.Now()
			err := sess.Wait()
			s.mu.Lock()
			if s.sess == sess {
				s.sess = nil
			}
			s.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			if time.Since(up) > maxB {
				wait = minB
			}
			s.b.log.Warn("MCP server down; restarting", "server", s.cfg.Name, "err", err, "backoff", wait)
		}
		for {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			wait = min(2*wait, maxB)
			next, err := s.connectAndRegister(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.b.log.Warn("MCP server restart failed", "server", s.cfg.Name, "err", err, "backoff", wait)
				continue
			}
			s.mu.Lock()
			s.sess = next
			s.mu.Unlock()
			if ctx.Err() != nil {
				s.closeSession()
				return
			}
			if err := s.startExecutor(ctx); err != nil {
				s.closeSession()
				if ctx.Err() != nil || errors.Is(err, errStopping) {
					return
				}
				s.b.log.Warn("MCP server up but its executor did not start; retrying", "server", s.cfg.Name, "err", err, "backoff", wait)
				continue
			}
			s.b.log.Info("MCP server restarted", "server", s.cfg.Name)
			sess = next
			break
		}
	}
}

func (s *server) askRelist() {
	select {
	case s.relist <- struct{}{}:
	default:
	}
}

// relister re-registers the tools when the server says its list changed.
// It runs apart from the session's handlers, which must not block on a
// request of the same session.
func (s *server) relister(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.relist:
		}
		sess := s.session()
		if sess == nil {
			continue // a restart lists them again
		}
		if err := s.register(ctx, sess); err != nil {
			s.b.log.Warn("re-registering the tools of an MCP server failed", "server", s.cfg.Name, "err", err)
		}
	}
}

func (s *server) session() *mcp.ClientSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess
}

func (s *server) closeSession() {
	s.mu.Lock()
	sess := s.sess
	s.sess = nil
	s.mu.Unlock()
	if sess != nil {
		_ = sess.Close()
	}
}

func (s *server) toolNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.names))
	for n := range s.names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// register lists the server's tools and registers each (a definition that
// did not change writes nothing; a changed one is a new version). A tool
// whose name cannot be a ledger tool's, or that was listed already, is
// skipped with a logged reason.
func (s *server) register(ctx context.Context, sess *mcp.ClientSession) error {
	cctx, cancel := context.WithTimeout(ctx, time.Duration(s.cfg.ConnectTimeoutMS)*time.Millisecond)
	defer cancel()
	var tools []*mcp.Tool
	var cursor string
	for {
		res, err := sess.ListTools(cctx, &mcp.ListToolsParams{Cursor: cursor})
		if err != nil {
			return fmt.Errorf("%w: tools/list: %w", ErrServerUnreachable, err)
		}
		tools = append(tools, res.Tools...)
		if res.NextCursor == "" {
			break
		}
		cursor = res.NextCursor
	}
	version := "0.0.0"
	if ir := sess.InitializeResult(); ir != nil && ir.ServerInfo != nil {
		var vs protocol.Violations
		if protocol.CheckSemver(&vs, "v", ir.ServerInfo.Version); len(vs) == 0 && ir.ServerInfo.Version != "" && !strings.Contains(ir.ServerInfo.Version, "+") {
			version = ir.ServerInfo.Version
		}
	}
	names := map[string]string{}
	listed := map[string]bool{}
	for _, t := range tools {
		name := *s.cfg.Prefix + t.Name
		// A name listed twice: the first listed is kept, every time, so a
		// listing does not register two versions in turn.
		if listed[t.Name] {
			s.b.log.Warn("MCP tool not registered", "server", s.cfg.Name, "mcp_tool", t.Name, "tool", name, "reason", "listed twice by tools/list; the first listed is registered")
			continue
		}
		listed[t.Name] = true
		if reason := s.skipReason(t, name); reason != "" {
			s.b.log.Warn("MCP tool not registered", "server", s.cfg.Name, "mcp_tool", t.Name, "tool", name, "reason", reason)
			continue
		}
		def, err := s.definition(t, name, version)
		if err != nil {
			s.b.log.Warn("MCP tool not registered", "server", s.cfg.Name, "mcp_tool", t.Name, "tool", name, "reason", err.Error())
			continue
		}
		if _, err := s.b.deps.Registrar.RegisterTool(cctx, def); err != nil {
			if _, refused := protocol.AsError(err); refused {
				s.b.log.Warn("MCP tool not registered: the ledger refused it", "server", s.cfg.Name, "mcp_tool", t.Name, "tool", name, "err", err)
				continue
			}
			return fmt.Errorf("register %s: %w", name, err)
		}
		names[name] = t.Name
	}
	s.mu.Lock()
	s.names = names
	s.mu.Unlock()
	s.b.log.Info("MCP tools registered", "server", s.cfg.Name, "listed", len(tools), "registered", len(names))
	return nil
}

// skipReason says why an MCP tool cannot be registered under name, or "".
func (s *server) skipReason(t *mcp.Tool, name string) string {
	switch {
	case s.cfg.Tools[t.Name].Skip:
		return "skipped by the configuration"
	case !protocol.ValidIdentifier(name):
		return fmt.Sprintf("%q is not a ledger identifier (printable ASCII without '.', '*', '>' or spaces, 1 to %d bytes)", name, protocol.MaxIdentifierLen)
	case reservedName(name):
		return fmt.Sprintf("%q is a built-in tool's name", name)
	}
	return ""
}

// Determinism derives a tool's determinism from its MCP annotations:
// readOnlyHint -> pure; else idempotentHint -> idempotent; else (MCP's
// defaults: destructive, not idempotent) side_effectful.
func Determinism(a *mcp.ToolAnnotations) string {
	switch {
	case a == nil:
		return protocol.DeterminismSideEffectful
	case a.ReadOnlyHint:
		return protocol.DeterminismPure
	case a.IdempotentHint:
		return protocol.DeterminismIdempotent
	}
	return protocol.DeterminismSideEffectful
}

// definition is the ledger definition of MCP tool t.
func (s *server) definition(t *mcp.Tool, name, version string) (*protocol.ToolDefinition, error) {
	params, err := json.Marshal(t.InputSchema)
	if err != nil || len(params) == 0 || params[0] != '{' {
		return nil, fmt.Errorf("inputSchema is not a JSON object")
	}
	det := Determinism(t.Annotations)
	if o := s.cfg.Tools[t.Name].Determinism; o != "" {
		det = o
	}
	desc := t.Description
	if desc == "" && t.Annotations != nil {
		desc = t.Annotations.Title
	}
	d := &protocol.ToolDefinition{
		ProjectID: s.b.cfg.Project, ToolName: name, Description: desc, Parameters: params,
		TargetSubject:  protocol.ToolTargetTemplate(s.cfg.Target),
		AfterExecution: protocol.AfterSuspend, Determinism: det, Limits: s.cfg.Limits,
		Owner: "mcp:" + s.cfg.Name,
	}
	// The version's build metadata is a digest of what was registered: the
	// same tool registers unchanged, a changed one as a new version.
	raw, err := json.Marshal(d.WithDefaults())
	if err != nil {
		return nil, fmt.Errorf("encode definition: %w", err)
	}
	sum := sha256.Sum256(raw)
	d.Version = version + "+mcp." + hex.EncodeToString(sum[:6])
	return d, nil
}

// onProgress turns a notifications/progress of a call in flight into the
// executor's progress (a heartbeat, and the record).
func (s *server) onProgress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	tok := fmt.Sprint(req.Params.ProgressToken)
	s.mu.Lock()
	c := s.calls[tok]
	s.mu.Unlock()
	if c == nil {
		return
	}
	c.call.Progress(executor.Progress{Progress: req.Params.Progress, Total: req.Params.Total, Message: req.Params.Message})
	s.mu.Lock()
	c.handled++
	close(s.progressed)
	s.progressed = make(chan struct{})
	s.mu.Unlock()
}

// Run implements executor.Tool: one tools/call under the call's deadline.
func (s *server) Run(ctx context.Context, call *executor.Call) executor.Outcome {
	s.mu.Lock()
	mcpName, ok := s.names[call.ToolName]
	sess := s.sess
	s.mu.Unlock()
	// Down first: a tool registered by an earlier run is not known to a
	// server not yet listed, and is not unknown for that.
	if sess == nil {
		return executor.Retryable(protocol.CodeToolUnavailable, fmt.Sprintf("MCP server %s is down (restarting)", s.cfg.Name), 0)
	}
	if !ok {
		return executor.Terminal(executor.CodeUnknownTool, fmt.Sprintf("MCP server %s does not list tool %s (any more)", s.cfg.Name, call.ToolName), "register the tool again, or call one the server lists")
	}
	tok := s.cfg.Name + "-" + strconv.FormatUint(s.tokens.Add(1), 10)
	s.mu.Lock()
	s.calls[tok] = &inflight{call: call}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.calls, tok)
		s.mu.Unlock()
	}()
	params := &mcp.CallToolParams{Name: mcpName, Arguments: call.Arguments}
	params.SetProgressToken(tok)
	// Canceling ctx (the worker's cancel, the deadline) makes the SDK send
	// notifications/cancelled.
	res, err := sess.CallTool(ctx, params)
	var werr *jsonrpc.Error
	if err == nil || errors.As(err, &werr) && werr.Code != codeRejectedByTransport {
		// The server answered: what it sent before is handed over first.
		// A lost session hands nothing more over; no wait then.
		s.settleProgress(ctx, tok)
	}
	if err != nil {
		return s.callError(ctx, call, err)
	}
	return outcome(res, s.cfg.Name, mcpName, call.ProgressLog(), s.cfg.MaxInlineBytes)
}

// codeRejectedByTransport is the SDK's JSON-RPC code for a request its
// transport could not hand over or whose HTTP exchange failed
// (jsonrpc2.ErrRejected): no answer of the server, so no wire error.
const codeRejectedByTransport = -32005

// callError maps a tools/call that got no result.
func (s *server) callError(ctx context.Context, call *executor.Call, err error) executor.Outcome {
	if ctx.Err() != nil {
		// The executor answers timeout or canceled itself.
		return executor.Retryable(executor.CodeTimeout, "interrupted: "+ctx.Err().Error(), 0)
	}
	var werr *jsonrpc.Error
	if errors.As(err, &werr) && werr.Code != codeRejectedByTransport {
		return wireOutcome(s.cfg.Name, werr)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		// Never delivered: the server is not there.
		return executor.Retryable(protocol.CodeToolUnavailable, fmt.Sprintf("MCP server %s: %v", s.cfg.Name, err), 0)
	}
	if call.Definition.Determinism == protocol.DeterminismSideEffectful {
		// The request was sent: the tool may have acted. Never run again.
		return executor.Terminal(protocol.CodeToolOutcomeUnknown, fmt.Sprintf("MCP server %s gave no answer to a side-effectful call (%v): whether it took effect is unknown", s.cfg.Name, err),
			"check the upstream for the call's effect before calling again")
	}
	return executor.Retryable(protocol.CodeToolUnavailable, fmt.Sprintf("MCP server %s: %v", s.cfg.Name, err), 0)
}
