// Package httpapi is serve's HTTP front: one router, built from one route
// table, for the audit API, the tool registry, export, health, readiness,
// metrics, the web page, the MCP endpoint and the OpenAPI document, with
// the 404/405 problem+json fallback for what no route serves. The handlers
// behind a route reach the rest of the tree through the fields of Config,
// so that only this package (and cmd/...) serves HTTP.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"

	"github.com/cgledger/cgledger/auditweb"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// Config names what the router serves. A nil handler or func leaves its
// routes out: a request for them is then answered by the fallback (404 with
// the "not served" violation when the OpenAPI document lists the route).
type Config struct {
	// Views are the projector's queries the audit API answers from, under
	// /v1/ (docs/audit-api.md); with them the web page is served at /ui/
	// and / redirects there. Nil leaves both out (serve without the
	// projector role).
	Views *projector.Queries
	// Audit wires the audit API's verification, approvals and operator
	// actions (with Views).
	Audit AuditConfig
	// Registry is the ledger the tool registry reads and writes, under
	// /projects/; nil leaves it out (serve without the api role).
	Registry Registry
	// Tools configures the tool registry (with Registry).
	Tools RegistryConfig
	// Builtins are the built-in tools the registry lists for a project
	// that did not register its own of the same name.
	Builtins []*protocol.ToolDefinition
	// MCP serves the ledger as an MCP server under /mcp/ (docs/mcp.md):
	// mcpfront's handler, mounted here.
	MCP http.Handler
	// Export writes the ledger's export lines from seq from on (GET
	// /v1/export). An error before the first byte is answered as a
	// problem (stream.ErrHistoryLost and ErrHistoryCorrupt as 404); after
	// it, the connection is aborted so that a client never takes a short
	// file for a whole one.
	Export func(ctx context.Context, w io.Writer, from uint64) error
	// Healthy says whether the process reaches NATS (GET /healthz).
	Healthy func() bool
	// Readiness answers GET /readyz: the body, and whether the process is
	// ready (else 503).
	Readiness func(r *http.Request) (body map[string]any, ready bool)
	// Metrics serves GET /metrics.
	Metrics http.Handler
	// Logger logs an export aborted mid-stream.
	Logger *slog.Logger
}

// Handler is the router New builds.
type Handler struct {
	mux *http.ServeMux
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Mux is the top-level router, whose patterns label the HTTP metrics (the
// audit API and the tool registry are mounted as sub-routers at /v1/ and
// /projects/).
func (h *Handler) Mux() *http.ServeMux { return h.mux }

type muxRoute struct {
	pattern string
	serve   http.Handler
}

// New builds the router from cfg.
func New(cfg Config) *Handler {
	mux := http.NewServeMux()
	for _, rt := range routes(cfg) {
		if rt.serve != nil {
			mux.Handle(rt.pattern, rt.serve)
		}
	}
	// GET /v1/openapi.json; 404/405 problem details for what no route serves.
	mux.Handle("/", fallback(mux))
	return &Handler{mux: mux}
}

// Routes are the patterns of the top-level route table (the catch-all
// aside): the audit API and the tool registry are mounted at /v1/ and
// /projects/ (their own patterns are AuditRoutes and RegistryRoutes). The
// OpenAPI document's tests check each is documented.
func Routes() []string {
	var out []string
	for _, rt := range routes(Config{}) {
		out = append(out, rt.pattern)
	}
	return out
}

// routes is the route table: a nil handler is a route not served here.
func routes(cfg Config) []muxRoute {
	var audit, ui, home, registry, export, health, ready, metrics http.Handler
	if cfg.Views != nil {
		audit = Audit(cfg.Views, cfg.Audit)
		ui = http.StripPrefix("/ui", auditweb.Handler())
		home = http.RedirectHandler("/ui/", http.StatusFound)
	}
	if cfg.Registry != nil {
		registry = NewRegistry(cfg.Registry, cfg.Tools, cfg.Builtins...)
	}
	if cfg.Export != nil {
		export = SingleValued(exportHandler(cfg.Export, cfg.Logger))
	}
	if cfg.Healthy != nil {
		health = healthz(cfg.Healthy)
	}
	if cfg.Readiness != nil {
		ready = readyz(cfg.Readiness)
	}
	if cfg.Metrics != nil {
		metrics = cfg.Metrics
	}
	return []muxRoute{
		{"/v1/", audit},
		{"GET /ui/", ui},
		{"GET /{$}", home},
		{"/projects/", registry},
		{"/mcp/", cfg.MCP},
		{"GET /v1/export", export},
		{"GET /healthz", health},
		{"GET /readyz", ready},
		{"GET /metrics", metrics},
	}
}

func exportHandler(export func(ctx context.Context, w io.Writer, from uint64) error, log *slog.Logger) http.HandlerFunc {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		from := uint64(1)
		if v := r.URL.Query().Get("from_seq"); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil || n == 0 {
				Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "from_seq must be a positive integer",
					Violations: []protocol.Violation{{Field: "from_seq", Code: protocol.VInvalidValue, Message: fmt.Sprintf("want a sequence >= 1, got %q", v)}}})
				return
			}
			from = n
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		sw := &startedWriter{w: w}
		if err := export(r.Context(), sw, from); err != nil {
			if !sw.started {
				w.Header().Del("Content-Type")
				if errors.Is(err, stream.ErrHistoryLost) || errors.Is(err, stream.ErrHistoryCorrupt) {
					// Kept nowhere, or not intact: retrying cannot help.
					err = &protocol.Error{Code: protocol.CodeNotFound, Message: err.Error()}
				}
				Error(w, err)
				return
			}
			// Mid-stream: abort the connection so the client sees a failed
			// transfer, never a short file that ends like a complete one.
			log.Error("export aborted", "err", err)
			panic(http.ErrAbortHandler)
		}
	}
}

// startedWriter remembers whether a response body was begun.
type startedWriter struct {
	w       io.Writer
	started bool
}

// Write implements io.Writer.
func (s *startedWriter) Write(p []byte) (int, error) {
	s.started = s.started || len(p) > 0
	return s.w.Write(p)
}

func healthz(healthy func() bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !healthy() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"status":"nats disconnected"}` + "\n"))
			return
		}
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	}
}

func readyz(readiness func(r *http.Request) (map[string]any, bool)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		body, ok := readiness(r)
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	}
}

// Pprof serves net/http/pprof under /debug/pprof/. serve runs it on its own
// listener, apart from the API and its authentication: profiles expose
// internals, so it is off unless asked for, and meant for loopback.
func Pprof() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
