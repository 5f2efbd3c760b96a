package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/httpapi"
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
	var cfg httpapi.Config
	if proj != nil {
		cfg.Views = projector.NewQueries(store)
		cfg.Audit = httpapi.AuditConfig{
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
		}
	}
	if s.has("api") {
		cfg.Registry, cfg.Tools = l, httpapi.RegistryConfig{Actor: httpAdminActor}
		cfg.Builtins = []*protocol.ToolDefinition{executor.EchoDefinition, executor.SleepDefinition}
	}
	// The ledger as an MCP server (docs/mcp.md): each call goes to the
	// ledger API over NATS as the path's agent, as the agent's own
	// dispatch would, wherever the API is served; the HTTP policy checks
	// the bearer's project and agent first.
	cfg.MCP = mcpfront.Handler(mcpfront.HTTPConfig{
		Ledger:    func(_, agent string) mcpfront.Ledger { return client.New(nc, client.WithActor(agent)) },
		Subscribe: natsSubscribe(nc),
		Builtins:  mcpBuiltins(), Logger: log, Version: version, CloseStreamAfter: s.mcpStreamPollAfter(),
	})
	cfg.Export = func(ctx context.Context, w io.Writer, from uint64) error {
		_, err := stream.ExportHistory(ctx, hist, l.StreamName(), w, from)
		return err
	}
	cfg.Logger = log
	cfg.Healthy = nc.IsConnected
	cfg.Readiness = func(r *http.Request) (map[string]any, bool) {
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
			body["status"], body["reason"], body["step"] = "not ready", "shutting down", shuttingDownStep
			return body, false
		}
		if !st.ready0.Load() || !nc.IsConnected() {
			reason, _ := st.projErr.Load().(string)
			if !st.ready0.Load() && reason == "" {
				// The projector's first catch-up (a rebuild included): its
				// reason is empty until it is ready or fails.
				body["step"] = catchingUpStep
			}
			if reason == "" {
				reason = "projector catching up"
			}
			if !nc.IsConnected() {
				reason = "nats disconnected"
			}
			body["status"], body["reason"] = "not ready", reason
			return body, false
		}
		if err := storageTrouble(guard, embeddedSrv, storageLog); err != nil {
			body["status"], body["reason"] = "not ready", err.Error()
			return body, false
		}
		if err := l.StorageFault(); err != nil {
			// Free space is not the whole story: the server itself refused
			// the last write. Ready again once a write goes through.
			body["status"], body["reason"] = "not ready", err.Error()
			return body, false
		}
		if st.storeBroken.Load() {
			// Pebble cannot be trusted after a failed write, even if a later
			// commit went through: not ready until serve has restarted.
			body["status"], body["reason"] = "not ready", "view store broken by a failed write: serve restarts itself in place once the disk has room"
			return body, false
		}
		return body, true
	}
	cfg.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	router := httpapi.New(cfg)
	var handler http.Handler = router
	if sa != nil {
		handler = sa.policy.Wrap(router)
	}
	handler = mcpfront.OriginGuard(handler)
	handler = instrumentHTTP(reg, router.Mux(), handler)
	return handler
}

// servePprof serves net/http/pprof on its own listener, apart from the API
// (and its authentication): profiles expose internals, so it is off unless
// asked for, and meant for loopback.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof %q: %w", addr, err)
	}
	hs := &http.Server{Handler: httpapi.Pprof(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server", "err", err)
		}
	}()
	log.Warn("pprof serving (no authentication)", "addr", "http://"+ln.Addr().String()+"/debug/pprof/")
	return func() { _ = hs.Close() }, nil
}
