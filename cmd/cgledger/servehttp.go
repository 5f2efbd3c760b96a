package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cgledger/cgledger/auditweb"
	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/docs"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/httpjson"
	"github.com/cgledger/cgledger/mcpfront"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// serveHTTPHandler builds serve's HTTP handler: every route of the roles
// that run, the 404/405 fallback, and the bearer policy, origin guard and
// metrics around them. The HTTP component calls it once every part the
// routes answer from has started.
func serveHTTPHandler(st *serveState) http.Handler {
	s, log, nc, js, l, sa := st.s, st.log, st.nc, st.js, st.l, st.sa
	store, hist, proj, arch, archiver, retention := st.store, st.hist, st.proj, st.arch, st.archiver, st.retention
	guard, embeddedSrv, storageLog, reg := st.guard, st.srv, st.storageLog, st.reg
	mux := http.NewServeMux()
	if proj != nil {
		mux.Handle("/v1/", projector.Handler(projector.NewQueries(store), projector.HTTPConfig{
			Verify: func(ctx context.Context) (stream.VerifyReport, error) {
				return store.VerifyHistory(ctx, hist)
			},
			// approve and deny go to the ledger API over NATS, as an
			// approver's own request would, wherever the API is served.
			Decide:   approvalDecider(nc),
			Approver: httpApprover(sa != nil),
			// call cancel and resolve likewise, as the admin's request.
			Operate:  operatorActions(nc),
			Operator: httpOperator(sa != nil),
		}))
		mux.Handle("GET /ui/", http.StripPrefix("/ui", auditweb.Handler()))
		mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	}
	if s.has("api") {
		mux.Handle("/projects/", executor.NewRegistryHandler(l, executor.RegistryConfig{Actor: httpAdminActor}, executor.EchoDefinition, executor.SleepDefinition))
	}

	// The ledger as an MCP server (docs/mcp.md): each call goes to the
	// ledger API over NATS as the path's agent, as the agent's own
	// dispatch would, wherever the API is served; the HTTP policy checks
	// the bearer's project and agent first.
	mux.Handle("/mcp/", mcpfront.Handler(mcpfront.HTTPConfig{
		Ledger:    func(_, agent string) mcpfront.Ledger { return client.New(nc, client.WithActor(agent)) },
		Subscribe: natsSubscribe(nc),
		Builtins:  mcpBuiltins(), Logger: log, Version: version, CloseStreamAfter: s.mcpStreamPollAfter(),
	}))
	mux.HandleFunc("GET /v1/export", httpjson.SingleValued(func(w http.ResponseWriter, r *http.Request) {
		from := uint64(1)
		if v := r.URL.Query().Get("from_seq"); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil || n == 0 {
				httpjson.Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "from_seq must be a positive integer",
					Violations: []protocol.Violation{{Field: "from_seq", Code: protocol.VInvalidValue, Message: fmt.Sprintf("want a sequence >= 1, got %q", v)}}})
				return
			}
			from = n
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		sw := &startedWriter{w: w}
		if _, err := stream.ExportHistory(r.Context(), hist, l.StreamName(), sw, from); err != nil {
			if !sw.started {
				w.Header().Del("Content-Type")
				if errors.Is(err, stream.ErrHistoryLost) || errors.Is(err, stream.ErrHistoryCorrupt) {
					// Kept nowhere, or not intact: retrying cannot help.
					err = &protocol.Error{Code: protocol.CodeNotFound, Message: err.Error()}
				}
				httpjson.Error(w, err)
				return
			}
			// Mid-stream: abort the connection so the client sees a failed
			// transfer, never a short file that ends like a complete one.
			log.Error("export aborted", "err", err)
			panic(http.ErrAbortHandler)
		}
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !nc.IsConnected() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"status":"nats disconnected"}` + "\n"))
			return
		}
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		body := map[string]any{"status": "ready", "roles": s.Roles}
		if proj != nil {
			body["applied_seq"] = proj.Applied()
		}
		if archiver != nil {
			body["archived_seq"] = archiver.Sealed()
			if n := archiver.Lost(); n > 0 {
				body["archive_lost_entries"] = n
			}
		}
		// The stream's end, so that a person watching a rebuild (or an
		// export) sees how far there is to go.
		lctx, cancel := context.WithTimeout(r.Context(), time.Second)
		if st, err := js.Stream(lctx, l.StreamName()); err == nil {
			state := st.CachedInfo().State
			body["last_seq"] = state.LastSeq
			if retention > 0 || arch != nil {
				// With a retention window the stream keeps only its tail.
				body["first_seq"] = max(state.FirstSeq, 1)
			}
		}
		cancel()
		if st.shuttingDown.Load() {
			body["status"], body["reason"] = "not ready", "shutting down"
			w.WriteHeader(http.StatusServiceUnavailable)
		} else if !st.ready0.Load() || !nc.IsConnected() {
			reason, _ := st.projErr.Load().(string)
			if reason == "" {
				reason = "projector catching up"
			}
			if !nc.IsConnected() {
				reason = "nats disconnected"
			}
			body["status"], body["reason"] = "not ready", reason
			w.WriteHeader(http.StatusServiceUnavailable)
		} else if err := storageTrouble(guard, embeddedSrv, storageLog); err != nil {
			body["status"], body["reason"] = "not ready", err.Error()
			w.WriteHeader(http.StatusServiceUnavailable)
		} else if err := l.StorageFault(); err != nil {
			// Free space is not the whole story: the server itself refused
			// the last write. Ready again once a write goes through.
			body["status"], body["reason"] = "not ready", err.Error()
			w.WriteHeader(http.StatusServiceUnavailable)
		} else if st.storeBroken.Load() {
			// Pebble cannot be trusted after a failed write, even if a later
			// commit went through: not ready until serve has restarted.
			body["status"], body["reason"] = "not ready", "view store broken by a failed write: serve restarts itself in place once the disk has room"
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", docs.Handler(mux)) // GET /v1/openapi.json; 404/405 problem details for what no route serves
	var handler http.Handler = mux
	if sa != nil {
		handler = sa.policy.Wrap(mux)
	}
	handler = mcpfront.OriginGuard(handler)
	handler = instrumentHTTP(reg, mux, handler)
	return handler
}

// startedWriter remembers whether a response body was begun.
type startedWriter struct {
	w       io.Writer
	started bool
}

func (s *startedWriter) Write(p []byte) (int, error) {
	s.started = s.started || len(p) > 0
	return s.w.Write(p)
}

// servePprof serves net/http/pprof on its own listener, apart from the API
// (and its authentication): profiles expose internals, so it is off unless
// asked for, and meant for loopback.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server", "err", err)
		}
	}()
	log.Warn("pprof serving (no authentication)", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	return func() { _ = hs.Close() }, nil
}
