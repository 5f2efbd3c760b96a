package mcpfront

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/internal/lru"
	"github.com/cgledger/cgledger/protocol"
)

// PathPrefix is where the front door is served on serve's HTTP listener:
// /mcp/{project}/{agent}.
const PathPrefix = "/mcp/"

// HTTPConfig is the front door over streamable HTTP.
type HTTPConfig struct {
	// Ledger returns the ledger as the agent of a project (a client acting
	// as that agent).
	Ledger func(project, agent string) Ledger
	// Subscribe is as in Config: every endpoint hears its agent's wakeups
	// through it.
	Subscribe Subscribe
	// Builtins, ProgressInterval, CloseStreamAfter, Logger and Version are
	// as in Config.
	Builtins         []*protocol.ToolDefinition
	ProgressInterval time.Duration
	CloseStreamAfter time.Duration
	Logger           *slog.Logger
	Version          string
	// MaxMessageBytes bounds a request body; DefaultMaxMessageBytes when
	// zero.
	MaxMessageBytes int64
	// SessionTimeout closes a session idle this long (its calls go on);
	// DefaultSessionTimeout when zero.
	SessionTimeout time.Duration
}

// DefaultSessionTimeout is how long an idle HTTP session is kept.
const DefaultSessionTimeout = 30 * time.Minute

// Handler serves /mcp/{project}/{agent}: one streamable HTTP endpoint per
// project and agent, each with sessions of its own (a session id of one
// endpoint means nothing at another). Who may reach which is the HTTP
// policy's business (internal/auth): this handler trusts the path.
func Handler(cfg HTTPConfig) http.Handler {
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &httpFront{cfg: cfg, endpoints: lru.New[http.Handler](MaxEndpoints)}
}

// MaxEndpoints bounds the endpoints (projects and agents) kept at once:
// the least recently used beyond it is dropped (its sessions are then
// unknown, and their clients start new ones; its calls go on).
const MaxEndpoints = 1024

type httpFront struct {
	cfg       HTTPConfig
	mu        sync.Mutex
	endpoints *lru.Cache[http.Handler]
}

// ParsePath reads project and agent from /mcp/{project}/{agent} (escaped
// segments unescaped); ok is false for any other path.
func ParsePath(escapedPath string) (project, agent string, ok bool) {
	rest, found := strings.CutPrefix(escapedPath, PathPrefix)
	if !found {
		return "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 2 {
		return "", "", false
	}
	p, err1 := url.PathUnescape(parts[0])
	a, err2 := url.PathUnescape(parts[1])
	if err1 != nil || err2 != nil {
		return "", "", false
	}
	return p, a, true
}

func (h *httpFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	project, agent, ok := ParsePath(r.URL.EscapedPath())
	if !ok {
		writeProblem(w, http.StatusNotFound, "not_found", "the MCP front door is at /mcp/{project}/{agent}", nil)
		return
	}
	var vs []protocol.Violation
	if !protocol.ValidIdentifier(project) {
		vs = append(vs, protocol.Violation{Field: "path.project", Code: protocol.VInvalidToken, Message: "must be an identifier"})
	}
	if !protocol.ValidIdentifier(agent) {
		vs = append(vs, protocol.Violation{Field: "path.agent", Code: protocol.VInvalidToken, Message: "must be an identifier"})
	}
	if len(vs) > 0 {
		writeProblem(w, http.StatusBadRequest, "bad_request", "invalid MCP endpoint path", vs)
		return
	}
	if why := badOrigin(r); why != "" {
		writeProblem(w, http.StatusForbidden, "forbidden", why, nil)
		return
	}
	if r.Method == http.MethodPost {
		body, err := io.ReadAll(io.LimitReader(r.Body, h.cfg.MaxMessageBytes+1))
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "bad_request", "reading the request body: "+err.Error(), nil)
			return
		}
		if int64(len(body)) > h.cfg.MaxMessageBytes {
			writeRPCError(w, http.StatusRequestEntityTooLarge, jsonrpc.CodeInvalidRequest,
				fmt.Sprintf("message longer than %d bytes refused (the front door's limit)", h.cfg.MaxMessageBytes))
			return
		}
		if refused(w, body) {
			return
		}
		body = rewriteBody(body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	}
	h.endpoint(project, agent).ServeHTTP(w, r)
}

// endpoint is the streamable HTTP handler of one project and agent, made on
// first use.
func (h *httpFront) endpoint(project, agent string) http.Handler {
	key := project + "\x00" + agent
	h.mu.Lock()
	defer h.mu.Unlock()
	if e, ok := h.endpoints.Get(key); ok {
		return e
	}
	f, err := New(Config{Project: project, Agent: agent, Ledger: h.cfg.Ledger(project, agent), Subscribe: h.cfg.Subscribe, Builtins: h.cfg.Builtins,
		ProgressInterval: h.cfg.ProgressInterval, CloseStreamAfter: h.cfg.CloseStreamAfter, Logger: h.cfg.Logger, Version: h.cfg.Version})
	if err != nil {
		// The path was checked: only a programming error gets here.
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeProblem(w, http.StatusInternalServerError, "internal", err.Error(), nil)
		})
	}
	srv := f.Server()
	// The event store lets a client whose stream broke mid-call resume it
	// (Last-Event-ID) and still get the answer; it is bounded (the SDK's
	// default, 10 MiB per endpoint) and in memory: after a restart of
	// serve the same request asks the ledger again instead.
	e := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Logger: h.cfg.Logger, SessionTimeout: h.cfg.SessionTimeout, MaxRequestBodyBytes: h.cfg.MaxMessageBytes,
		EventStore: mcp.NewMemoryEventStore(nil),
	})
	h.endpoints.Put(key, e)
	return e
}

// refused answers, as JSON-RPC, a message the SDK would answer in plain
// text (an unknown method, a request without an id) or misread (an id that
// is neither a string nor an integer), and reports whether it did. A body
// that is not one JSON-RPC message is the SDK's to answer.
func refused(w http.ResponseWriter, body []byte) bool {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return false
	}
	msg, err := jsonrpc.DecodeMessage(trimmed)
	if err != nil {
		return false
	}
	if why := requestIDProblem(trimmed); why != "" {
		writeRPCError(w, http.StatusBadRequest, jsonrpc.CodeInvalidRequest, why)
		return true
	}
	rpcErr, unknownNotification := methodProblem(msg)
	switch {
	case unknownNotification:
		// JSON-RPC ignores a notification it does not know.
		w.WriteHeader(http.StatusAccepted)
		return true
	case rpcErr == nil:
		return false
	case rpcErr.Code == jsonrpc.CodeMethodNotFound:
		// A request, answered as any other: under its id, with 200.
		b, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: msg.(*jsonrpc.Request).ID, Error: rpcErr})
		if err != nil {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
		return true
	}
	writeRPCError(w, http.StatusBadRequest, rpcErr.Code, rpcErr.Message)
	return true
}

// rewriteBody writes the request id of a tools/call into its _meta
// (withRequestID). A body that is not one JSON-RPC message goes to the SDK
// as it came, which answers it.
func rewriteBody(body []byte) []byte {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return body
	}
	msg, err := jsonrpc.DecodeMessage(trimmed)
	if err != nil {
		return body
	}
	out := withRequestID(msg)
	if out == msg {
		return body
	}
	b, err := jsonrpc.EncodeMessage(out)
	if err != nil {
		return body
	}
	return b
}

// OriginGuard refuses a cross-site request to the front door (badOrigin)
// with 403 before next sees it: next is the whole HTTP API behind its
// authentication, and the Origin check comes first, whatever the request's
// credential (docs/mcp.md, "Cross-site and DNS rebinding").
func OriginGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, PathPrefix) {
			if why := badOrigin(r); why != "" {
				writeProblem(w, http.StatusForbidden, "forbidden", why, nil)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// badOrigin says why a request with an Origin header from another site is
// refused (DNS rebinding and cross-site requests from browsers, as the MCP
// transport spec asks): the origin's host must be the request's Host or a
// loopback name. The SDK itself refuses a request that reached a loopback
// address with a Host that is not loopback.
func badOrigin(r *http.Request) string {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return ""
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return "the Origin header is not an origin"
	}
	if strings.EqualFold(u.Host, r.Host) || isLoopback(u.Hostname()) {
		return ""
	}
	return fmt.Sprintf("origin %s is neither this server (%s) nor a loopback name: refused as a cross-site request", origin, r.Host)
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// writeProblem answers as the rest of the HTTP API does: problem details
// with the protocol's code and every violation.
func writeProblem(w http.ResponseWriter, status int, code, detail string, vs []protocol.Violation) {
	pvs := make([]problem.Violation, len(vs))
	for i, v := range vs {
		pvs[i] = problem.Violation(v)
	}
	problem.Write(w, problem.New(status, code, detail, pvs))
}

// writeRPCError answers with a JSON-RPC error body (id null), for a
// message refused before it could be read.
func writeRPCError(w http.ResponseWriter, status int, code int64, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": code, "message": msg}})
}
