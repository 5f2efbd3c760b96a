// Package mcpfront is the ledger as an MCP server (docs/mcp.md, "The ledger
// as an MCP server"): an MCP client lists a project's tools and calls them,
// and every call is a ledger call, dispatched under the connection's agent
// and turn, answered from its report, with exactly one outcome however often
// the client asks.
//
// The protocol itself is the official Go SDK's (github.com/modelcontextprotocol/go-sdk);
// this package only maps MCP's tools/list and tools/call onto the ledger's
// operations, through the client package's API (the same operations any
// worker in any language has).
package mcpfront

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/protocol"
)

// Keys of _meta the front door reads on tools/call and writes on its
// answers. The prefix is the front door's own (MCP reserves unprefixed and
// modelcontextprotocol.io names).
const (
	// MetaToolCallID names the call's tool_call_id (an identifier). A
	// client that sets it makes its retries of one call duplicates even
	// across request ids; without it the JSON-RPC request id is used.
	MetaToolCallID = "cgledger/tool_call_id"
	// MetaAgentTurnID names the call's agent_turn_id, instead of the
	// session's turn: a client that reconnects (a new session) asks again
	// for a call of its old session with the old turn and call ids.
	MetaAgentTurnID = "cgledger/agent_turn_id"
	// MetaTimeoutMS is the call's budget in milliseconds (the dispatch's
	// timeout_ms); absent, the tool's default.
	MetaTimeoutMS = "cgledger/timeout_ms"
	// MetaRequestID carries the JSON-RPC id of a tools/call request into
	// the handler: the transports write it (overwriting any value a client
	// sent), since the SDK does not hand request ids to handlers.
	MetaRequestID = "cgledger/request_id"
	// MetaStatus, MetaReportSeq and MetaResultCardID are set on every
	// answer to tools/call that comes from a report: the report's status,
	// its entry's sequence and the result card, so a client can find the
	// call in the audit API.
	MetaStatus       = "cgledger/status"
	MetaReportSeq    = "cgledger/report_seq"
	MetaResultCardID = "cgledger/tool_result_card_id"
	// MetaDuplicate is true on an answer whose dispatch the ledger took as
	// a repeat of an earlier one: the stored outcome, nothing run again.
	MetaDuplicate = "cgledger/duplicate"
)

// Ledger is what the front door needs of the ledger: the worker's
// operations of package client (a *client.Client acting as the agent).
type Ledger interface {
	ListTools(ctx context.Context, project string) ([]protocol.StoredTool, error)
	GetTool(ctx context.Context, project, tool string) (*protocol.StoredTool, error)
	Dispatch(ctx context.Context, req protocol.DispatchRequest) (protocol.DispatchResult, error)
	GetCall(ctx context.Context, project, turnID, callID string) (*protocol.CallRecord, error)
	GetCards(ctx context.Context, project string, ids []string) ([]protocol.StoredCard, []string, error)
	Cancel(ctx context.Context, req protocol.CancelRequest) (protocol.CancelResult, error)
	GetRoster(ctx context.Context, project, agentID string) (protocol.RosterResult, error)
	SetRoster(ctx context.Context, e protocol.RosterEntry) (protocol.RosterResult, error)
}

// Config is one front door: a project, the agent its calls are dispatched
// as, and the ledger it reaches.
type Config struct {
	Project string
	Agent   string
	// Channel of the calls; "mcp" when empty.
	Channel string
	Ledger  Ledger
	// Subscribe lets the front door hear the agent's wakeups, so a call is
	// answered as soon as its report is accepted; nil, it polls call.get
	// (docs/mcp.md, "Waiting for the report").
	Subscribe Subscribe
	// Builtins are the definitions of the tools every project has without
	// registering them (the executor's echo and sleep), listed and
	// callable unless the project registered its own under the same name.
	Builtins []*protocol.ToolDefinition
	// ProgressInterval is how often a call whose client gave a
	// progressToken is told it is still waiting; DefaultProgressInterval
	// when zero.
	ProgressInterval time.Duration
	// CloseStreamAfter, over streamable HTTP, ends the SSE stream of a
	// tools/call still waiting this long, telling the client to reconnect
	// (SEP-1699 polling): the answer comes on the resumed stream, from the
	// event store, whenever the report arrives. Zero keeps streams open.
	CloseStreamAfter time.Duration
	// Logger, nil for none.
	Logger *slog.Logger
	// Version is the server version the front door gives in initialize.
	Version string
}

// DefaultChannel is the channel of the front door's calls.
const DefaultChannel = "mcp"

// DefaultProgressInterval is how often a waiting call reports progress.
const DefaultProgressInterval = 500 * time.Millisecond

// ReportWaitGrace is how long after a call's deadline the front door still
// waits for its report: the ledger records a timeout at the deadline plus
// its grace (5 s), so a report always comes within this.
const ReportWaitGrace = 15 * time.Second

// Front is the ledger as an MCP server for one project and agent.
type Front struct {
	cfg   Config
	log   *slog.Logger
	turns sync.Map // *mcp.ServerSession without a session id -> turn id
	wake  waker
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration (a project, agent or channel that is not an identifier,
// a negative interval), or nil. Zero values are the defaults and pass; New
// calls it.
func (cfg Config) Validate() error {
	var vs protocol.Violations
	if !protocol.ValidIdentifier(cfg.Project) {
		vs = append(vs, protocol.Violation{Field: "project", Code: protocol.VInvalidToken, Message: "must be an identifier"})
	}
	if !protocol.ValidIdentifier(cfg.Agent) {
		vs = append(vs, protocol.Violation{Field: "agent", Code: protocol.VInvalidToken, Message: "must be an identifier"})
	}
	if cfg.Channel != "" && !protocol.ValidIdentifier(cfg.Channel) {
		vs = append(vs, protocol.Violation{Field: "channel", Code: protocol.VInvalidToken, Message: "must be an identifier"})
	}
	configcheck.NonNegative(&vs, "ProgressInterval", cfg.ProgressInterval)
	configcheck.NonNegative(&vs, "CloseStreamAfter", cfg.CloseStreamAfter)
	return protocol.BadRequest("MCP front door settings", vs)
}

// New checks cfg and returns the front door.
func New(cfg Config) (*Front, error) {
	// Unwrapped: the refusal names the front door's settings already, and
	// `cgledger mcp serve` prints it as it is.
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Channel == "" {
		cfg.Channel = DefaultChannel
	}
	if cfg.Ledger == nil {
		return nil, errors.New("mcpfront: no ledger")
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Front{cfg: cfg, log: log}
	f.wake.f = f
	return f, nil
}

// Server returns an MCP server whose tools are the project's: tools/list
// and tools/call are answered from the ledger, everything else (initialize,
// ping, logging) by the SDK.
func (f *Front) Server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "cgledger", Title: "cgledger (project " + f.cfg.Project + ")", Version: f.cfg.Version},
		&mcp.ServerOptions{
			// Tools change when someone registers one; the front door does
			// not watch for that, so it promises no list_changed.
			Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Logging: &mcp.LoggingCapabilities{}},
			Logger:       f.log,
			GetSessionID: NewTurnID,
		})
	s.AddReceivingMiddleware(f.middleware)
	return s
}

// NewTurnID returns a fresh turn id, "mcp-" and 32 hex digits: the turn of
// an MCP session (and, over HTTP, its Mcp-Session-Id).
func NewTurnID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "mcp-" + hex.EncodeToString(b)
}

func (f *Front) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/list":
			return f.listTools(ctx)
		case "tools/call":
			ss, _ := req.GetSession().(*mcp.ServerSession)
			p, ok := req.GetParams().(*mcp.CallToolParamsRaw)
			if !ok || ss == nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "tools/call without its parameters"}
			}
			var closeStream func(mcp.CloseSSEStreamArgs)
			if x := req.GetExtra(); x != nil {
				closeStream = x.CloseSSEStream
			}
			return f.callTool(ctx, ss, p, closeStream)
		}
		return next(ctx, method, req)
	}
}

// turn is the session's turn: its session id when that is an identifier
// (the HTTP transport's, which NewTurnID made), else one made on first use
// and kept until the session ends.
func (f *Front) turn(ss *mcp.ServerSession) string {
	if id := ss.ID(); protocol.ValidIdentifier(id) {
		return id
	}
	if v, ok := f.turns.Load(ss); ok {
		return v.(string)
	}
	v, loaded := f.turns.LoadOrStore(ss, NewTurnID())
	if !loaded {
		go func() {
			_ = ss.Wait()
			f.turns.Delete(ss)
		}()
	}
	return v.(string)
}

// tools reads the project's tools in force and the built-ins it did not
// override, by name.
func (f *Front) tools(ctx context.Context) ([]protocol.ToolDefinition, error) {
	stored, err := f.cfg.Ledger.ListTools(ctx, f.cfg.Project)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	out := make([]protocol.ToolDefinition, 0, len(stored)+len(f.cfg.Builtins))
	for _, st := range stored {
		seen[st.Definition.ToolName] = true
		out = append(out, st.Definition)
	}
	for _, b := range f.cfg.Builtins {
		if !seen[b.ToolName] {
			d := *b
			d.ProjectID = f.cfg.Project
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ToolName < out[j].ToolName })
	return out, nil
}

// tool reads one tool in force: registered, else built in; nil when the
// project has no such tool.
func (f *Front) tool(ctx context.Context, name string) (*protocol.ToolDefinition, error) {
	if !protocol.ValidIdentifier(name) {
		return nil, nil
	}
	st, err := f.cfg.Ledger.GetTool(ctx, f.cfg.Project, name)
	if err == nil {
		return &st.Definition, nil
	}
	if !errors.Is(err, protocol.ErrNotFound) {
		return nil, err
	}
	for _, b := range f.cfg.Builtins {
		if b.ToolName == name {
			d := *b
			d.ProjectID = f.cfg.Project
			return &d, nil
		}
	}
	return nil, nil
}

func (f *Front) listTools(ctx context.Context) (*mcp.ListToolsResult, error) {
	defs, err := f.tools(ctx)
	if err != nil {
		return nil, ledgerError("tools/list", err)
	}
	res := &mcp.ListToolsResult{Tools: []*mcp.Tool{}}
	for i := range defs {
		res.Tools = append(res.Tools, MCPTool(&defs[i]))
	}
	return res, nil
}

// MCPTool is a tool definition as tools/list shows it: parameters as the
// input schema (kept byte for byte, so every JSON Schema 2020-12 keyword
// stays), the description (the tool's name when it has none, since MCP
// clients expect one), annotations from its determinism and, in _meta, the
// definition's version.
func MCPTool(d *protocol.ToolDefinition) *mcp.Tool {
	desc := d.Description
	if desc == "" {
		desc = "Tool " + d.ToolName + " of project " + d.ProjectID + " (cgledger)."
	}
	t := &mcp.Tool{Name: d.ToolName, Description: desc, InputSchema: json.RawMessage(d.Parameters), Annotations: Annotations(d.Determinism)}
	if len(d.Parameters) == 0 {
		t.InputSchema = json.RawMessage(`{"type":"object"}`)
	}
	if d.Version != "" {
		t.Meta = mcp.Meta{"cgledger/version": d.Version}
	}
	return t
}

// Annotations maps a determinism onto MCP's hints: pure is read-only,
// idempotent is idempotent and not destructive, side_effectful destructive
// (MCP's default for a tool that says nothing).
func Annotations(determinism string) *mcp.ToolAnnotations {
	no, yes := false, true
	switch determinism {
	case protocol.DeterminismPure:
		return &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, DestructiveHint: &no}
	case protocol.DeterminismIdempotent:
		return &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: &no}
	default:
		return &mcp.ToolAnnotations{DestructiveHint: &yes}
	}
}

// ledgerError is a failure to reach or use the ledger as a JSON-RPC error:
// the ledger's refusal (code, violations, rejection_seq) as data.
func ledgerError(what string, err error) error {
	pe, ok := protocol.AsError(err)
	if !ok {
		pe = &protocol.Error{Code: protocol.CodeInternal, Message: err.Error()}
	}
	code := int64(jsonrpc.CodeInternalError)
	switch pe.Code {
	case protocol.CodeBadRequest, protocol.CodeConflict, protocol.CodeMismatch, protocol.CodeStaleEpoch:
		code = jsonrpc.CodeInvalidParams
	case protocol.CodeForbidden:
		// The connection's credential may not do this: asking again cannot
		// help, unlike -32603.
		code = jsonrpc.CodeInvalidRequest
	}
	data, _ := json.Marshal(pe)
	return &jsonrpc.Error{Code: code, Message: fmt.Sprintf("%s: %s: %s", what, pe.Code, pe.Message), Data: data}
}

// invalidParams is a tools/call refused before any dispatch, with every
// violation.
func invalidParams(msg string, vs []protocol.Violation) error {
	pe := &protocol.Error{Code: protocol.CodeBadRequest, Message: msg, Violations: vs}
	data, _ := json.Marshal(pe)
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: pe.Error(), Data: data}
}

// cardIDs derives the tool.call card id and trace id from the call's
// identity: a repeated dispatch must carry the same card (cards are
// immutable), so nothing in it may be drawn at random.
func cardIDs(project, turn, call string) (cardID, traceID, spanID string) {
	sum := sha256.Sum256([]byte(project + "\x00" + turn + "\x00" + call))
	return "cc-" + hex.EncodeToString(sum[16:28]), hex.EncodeToString(sum[:16]), hex.EncodeToString(sum[24:32])
}
