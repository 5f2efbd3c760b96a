package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cgledger/cgledger/internal/backoff"

	"github.com/cgledger/cgledger/executor/jina"
	"github.com/cgledger/cgledger/httpapi"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cgledger/cgledger/archive"
	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/diskspace"
	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/mcpfront"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

const serveHelp = `Run cgledger. With no flags: an embedded JetStream nats-server (data under ./data,
NATS on 127.0.0.1:4222), the ledger and its NATS request/reply API, the executor with the
built-in tools, the projector, and an HTTP server on 127.0.0.1:8080 with /healthz, /readyz,
/metrics, the audit API under /v1/ (its OpenAPI document at /v1/openapi.json), the audit
web page at /ui/ and the tool registry under /projects/.

With --nats-url it uses an existing NATS JetStream server or cluster instead (use
--replicas 3 on a cluster); --roles runs only some parts (api, executor, projector), so
several processes can share one cluster. Settings come from defaults, a config file
(--config or CGLEDGER_CONFIG), CGLEDGER_* environment variables and flags, later ones
winning; "cgledger check-config" shows the result.

SIGTERM or SIGINT shuts down gracefully (stop pulling commands, drain in-flight calls, stop
the API, sync the projector checkpoint, drain NATS, stop the embedded server last); a second
signal exits at once.`

func serve(args []string) int {
	fs := newFlagSet("serve", "serve [flags]", serveHelp)
	cfgPath := configFlags(fs)
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	s, source, err := loadSettings(fs, *cfgPath)
	var vs protocol.Violations
	if e, ok := protocol.AsError(err); ok {
		vs = append(vs, e.Violations...)
	} else if err != nil {
		return failf(exitUsage, "serve: %v", err)
	}
	if vs = append(vs, s.validate()...); len(vs) > 0 {
		for _, v := range vs {
			from := ""
			if src := source[v.Field]; src != "" && src != "default" && !strings.Contains(v.Message, " from ") {
				from = " (set by " + src + ")"
			}
			fmt.Fprintf(os.Stderr, "cgledger serve: %s: %s%s\n", v.Field, v.Message, from)
		}
		fmt.Fprintln(os.Stderr, "cgledger serve: fix the settings above (cgledger check-config lists every setting and where it came from)")
		return exitUsage
	}
	log := newLogger(s)
	if s.NATSURL != "" && source["nats_url"] != "flag --nats-url" {
		// The same variable names the server for the client verbs: say so,
		// since it also turns the embedded server off here.
		log.Warn("using an external NATS server instead of the embedded one", "nats_url", s.NATSURL, "set_by", source["nats_url"],
			"hint", "unset it (or clear nats_url) to run the embedded server")
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		<-sigs
		log.Info("signal received: shutting down (send it again to exit at once)")
		stop()
		<-sigs
		log.Warn("second signal: exiting at once")
		os.Exit(130)
	}()
	s.restartInPlace = true
	stopTracing, err := setupTracing(ctx, log)
	if err != nil {
		log.Error("serve failed", "err", err)
		return exitFailed
	}
	defer stopTracing()
	if err := runServe(ctx, s, log, nil); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// Stopped by a signal while a start-up step waited for the
			// cluster: a requested stop, not a failure.
			log.Info("stopped before serving", "step_err", err)
			return exitOK
		}
		log.Error("serve failed", "err", err)
		return exitFailed
	}
	return exitOK
}

func newLogger(s Settings) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(s.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if s.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// natsOptions are the connection options for --nats-url.
func natsOptions(s Settings, name string) []nats.Option {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	if s.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(s.NATSCreds))
	}
	if s.NATSUser != "" {
		opts = append(opts, nats.UserInfo(s.NATSUser, s.NATSPassword))
	}
	if s.NATSToken != "" {
		opts = append(opts, nats.Token(s.NATSToken))
	}
	return opts
}

// serving describes a running serve, for callers in this process (bench).
type serving struct {
	HTTP, NATS string
	// Embedded is the embedded nats-server (nil with --nats-url).
	Embedded *server.Server
}

// runServe runs until ctx ends. ready, when not nil, is told where it serves
// once it does.
func runServe(ctx context.Context, s Settings, log *slog.Logger, ready func(serving)) error {
	url := s.NATSURL
	embedded := url == ""
	unlock, err := preflight(s, embedded)
	if err != nil {
		return err
	}
	defer unlock()
	// Listening first: a port in use is reported before anything starts.
	ln, err := net.Listen("tcp", s.HTTPListen)
	if err != nil {
		return fmt.Errorf("http_listen %q: %w", s.HTTPListen, err)
	}
	defer ln.Close()
	var sa *serveAuth
	if s.NoAuth {
		log.Warn("authentication is OFF (--no-auth): anyone who reaches NATS or HTTP can forge, halt or delete the ledger; see docs/security.md")
	} else {
		if sa, err = setupAuth(s.Data, embedded, log); err != nil {
			if !embedded {
				return fmt.Errorf("HTTP authentication needs the ledger account's keys in %s (see docs/security.md, \"External cluster\"), or --no-auth: %w", authDir(s.Data), err)
			}
			return err
		}
	}
	serverTLS, err := loadTLS(s.TLSCert, s.TLSKey, s.TLSCA, true)
	if err != nil {
		return err
	}
	// A soft memory limit keeps the heap near what it holds rather than
	// twice that: the ledger's memory grows with history (the stream's
	// subject index), so headroom the collector could reclaim is not left
	// to grow with it.
	if s.MemoryLimit != "" && s.MemoryLimit != "off" && os.Getenv("GOMEMLIMIT") == "" {
		limit, _ := diskspace.ParseSize(s.MemoryLimit) // validated
		debug.SetMemoryLimit(int64(limit))
	}
	var embeddedSrv *server.Server
	var storageLog *natsserver.StorageLog
	if embedded {
		host, portStr, _ := net.SplitHostPort(s.NATSListen)
		port, err := strconv.Atoi(portStr)
		if err != nil {
			return fmt.Errorf("nats_listen %q: bad port: %w", s.NATSListen, err)
		}
		storeDir, err := filepath.Abs(filepath.Join(s.Data, "jetstream"))
		if err != nil {
			return fmt.Errorf("data %q: %w", s.Data, err)
		}
		storageLog = &natsserver.StorageLog{Log: log}
		cfg := natsserver.Config{StoreDir: storeDir, Host: host, Port: port, SyncAlways: s.SyncAlways, TLS: serverTLS, Logger: storageLog}
		if sa != nil {
			cfg.Trust = sa.trust
		}
		if s.SyncInterval != "" {
			cfg.SyncInterval, _ = time.ParseDuration(s.SyncInterval)
		}
		srv, err := natsserver.Start(cfg)
		if err != nil {
			return fmt.Errorf("start embedded nats-server: %w", err)
		}
		embeddedSrv = srv
		defer func() {
			srv.Shutdown()
			srv.WaitForShutdown()
			log.Info("embedded nats-server stopped")
		}()
		scheme := "nats://"
		if serverTLS != nil {
			scheme = "tls://"
		}
		url = scheme + srv.Addr().String()
	}
	opts := natsOptions(s, "cgledger-serve")
	if embedded && sa != nil {
		opts = append(opts, nats.UserJWTAndSeed(sa.ledger.JWT, sa.ledger.Seed))
	}
	if clientTLS, err := loadTLS(s.TLSCert, s.TLSKey, s.TLSCA, false); err != nil {
		return err
	} else if clientTLS != nil {
		if embedded && s.TLSCA == "" {
			// The embedded server's certificate is ours; without a CA to check
			// it against, trust it as the server we just started.
			clientTLS.InsecureSkipVerify = true //nolint:gosec // loopback to our own listener
		}
		opts = append(opts, nats.Secure(clientTLS))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if !embedded && os.Getenv("CGLEDGER_NATS_URL") != "" {
			return fmt.Errorf("connect %s (from CGLEDGER_NATS_URL: with it set, serve uses that server instead of starting the embedded one): %w", url, err)
		}
		return fmt.Errorf("connect %s: %w", url, err)
	}
	defer nc.Close()
	defer func() {
		if err := nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			log.Warn("nats drain", "err", err)
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	var store *projector.Store
	var viewsApplied uint64
	if s.has("projector") {
		views := filepath.Join(s.Data, "views")
		// Views of another format are emptied and rebuilt from the ledger:
		// first make sure that the ledger still has every entry they hold.
		opts := projector.StoreOptions{BeforeRebuild: func(fc projector.FormatChange) error {
			return untilClusterAnswers(ctx, log, "check the ledger before rebuilding the views", func() error {
				return checkRebuild(ctx, js, s.Data, views, fc)
			})
		}}
		if store, err = projector.OpenStore(views, opts); err != nil {
			return err
		}
		if fc := store.FormatChange(); fc != nil {
			log.Warn("views format changed: rebuilding the views from the ledger", "reason", fc.Reason, "from_format", fc.From, "format", projector.ViewsFormat)
		}
		defer func() {
			if err := store.Close(); err != nil {
				log.Error("close view store", "err", err)
			}
		}()
		if viewsApplied, err = store.Applied(); err != nil {
			return err
		}
		if fc := store.FormatChange(); fc != nil {
			// The emptied views still tell how far the ledger had come.
			viewsApplied = fc.Applied
		}
	}
	// Every start-up step that talks to JetStream runs under serve's
	// start-up policy (untilClusterAnswers): on a cluster electing a leader
	// serve waits, not ready, instead of exiting.
	var recorded bool
	if err := untilClusterAnswers(ctx, log, "read the ledger stream", func() (err error) {
		recorded, err = checkLedgerStream(ctx, js, ledger.DefaultStream, s.Data, viewsApplied)
		return err
	}); err != nil {
		return err
	}
	// Writes stop before the data directory's disk is full: JetStream
	// disables itself and Pebble cannot continue after a failed write.
	var guard *diskspace.Guard
	var ledgerGuard, viewGuard func() error
	if embedded || s.has("projector") {
		reserve, _ := diskspace.ParseSize(s.DiskReserve) // validated; empty and off are 0
		guard = diskspace.New(s.Data, reserve, s.DiskReserve == "off")
		if embedded {
			ledgerGuard = func() error { return storageTrouble(guard, embeddedSrv, storageLog) }
		}
		if s.has("projector") {
			viewGuard = guard.Check
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "cgledger_data_free_bytes",
			Help: "Free bytes on the file system of the data directory; writes stop below the reserve (docs/durability.md).",
		}, func() float64 { _ = guard.Check(); return float64(guard.Free()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "cgledger_data_reserve_bytes",
				Help: "The disk reserve: free bytes on the data directory's file system below which writes stop (disk_reserve, else the smaller of 64 MiB and 10% of the file system; 0 when the check is off). Alerts compare cgledger_data_free_bytes with it.",
			}, func() float64 { _ = guard.Check(); return float64(guard.Reserve()) }))
	}
	retention, _ := parseDays(s.Retention)              // validated
	toolAckWait, _ := time.ParseDuration(s.ToolAckWait) // validated; empty is the ledger's default
	l, err := openLedger(ctx, nc, ledger.Config{Registerer: reg, Logger: log, Streams: ledger.StreamConfig{Replicas: s.Replicas, ManagedRetention: true}, WriteGuard: ledgerGuard, Retention: retention, ToolAckWait: toolAckWait,
		BuiltinTools: []protocol.ToolDefinition{*executor.EchoDefinition, *executor.SleepDefinition}}, log)
	if err != nil {
		return err
	}
	registerServeMetrics(reg, nc, js, l.ToolLabels(), l.StreamName(), "KV_"+l.BucketName())
	reg.MustRegister(l.ToolCollector())
	// After the executor and the API have stopped: finish marking answered
	// calls before the connection drains.
	defer l.Close()
	if !recorded {
		if err := untilClusterAnswers(ctx, log, "record the ledger stream", func() error {
			return recordLedgerStream(ctx, js, l.StreamName(), s.Data)
		}); err != nil {
			return err
		}
	}

	// History older than the retention window lives in the archive.
	sealAge, _ := parseDays(s.ArchiveSeal)
	hist, arch, err := openHistory(js, l.StreamName(), filepath.Join(s.Data, "archive"), retention > 0)
	if err != nil {
		return err
	}
	var archiver *archive.Archiver
	if retention == 0 && arch != nil {
		// Entries written while retention was set still expire on their
		// own TTL: the archiver goes on copying them (and every later
		// entry) so that none expires unarchived.
		log.Warn("retention is off but the data directory has an archive: archiving goes on, so that entries written with a retention window are archived before they expire", "archive", filepath.Join(s.Data, "archive"))
	}
	if arch != nil {
		acfg := archive.Config{Streams: ledger.StreamConfig{Replicas: s.Replicas}, Retention: retention, SealAge: sealAge, Logger: log, Registerer: reg}
		if store != nil {
			acfg.LinkAt = store.LinkAt
		}
		if archiver, err = archive.New(arch, js, acfg); err != nil {
			return err
		}
		archCtx, stopArchiver := context.WithCancel(context.WithoutCancel(ctx))
		archDone := make(chan struct{})
		go func() {
			defer close(archDone)
			_ = archiver.Run(archCtx)
		}()
		// Stopped last of the parts that read the stream, so that it seals
		// every entry written before the shutdown.
		defer func() {
			stopArchiver()
			<-archDone
			log.Info("archiver stopped", "sealed_seq", archiver.Sealed())
		}()
	} else if err := untilClusterAnswers(ctx, log, "apply retention", func() error {
		return ledger.ApplyRetention(ctx, js, ledger.StreamConfig{Replicas: s.Replicas}, 0)
	}); err != nil {
		return err
	}

	var storeBroken atomic.Bool
	if guard != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "cgledger_storage_degraded",
			Help: "1 while the data directory's storage takes no writes (free space below the reserve, the embedded server's stream failed by a write error, the last ledger write refused for want of storage, or the view store broken); /readyz says why.",
		}, func() float64 {
			if storageTrouble(guard, embeddedSrv, storageLog) != nil || l.StorageFault() != nil || storeBroken.Load() {
				return 1
			}
			return 0
		}))
	}
	if guard != nil && s.restartInPlace {
		// Only the embedded server is reset by restarting serve: an external
		// server's refusal is for its operator.
		fault := func() error { return nil }
		if embedded {
			fault = l.StorageFault
		}
		go superviseStorage(ctx, log, s.Data, guard, embeddedSrv, storageLog, fault, &storeBroken)
	}
	var ready0, shuttingDown atomic.Bool
	var projErr atomic.Value
	// The routes serve answers, filled in as each role starts (httpapi.New
	// builds the router from it once they have).
	var httpCfg httpapi.Config
	// The parts that serve work live until the shutdown sequence at the end
	// ends them, in order, not at the signal: a call in flight is finished,
	// reported and visible before HTTP and the API stop.
	life, endLife := context.WithCancel(context.WithoutCancel(ctx))
	defer endLife()
	var proj *projector.Projector
	if s.has("projector") {
		pcfg := projector.Config{Stream: l.StreamName(), Registerer: reg, Logger: log, WriteGuard: viewGuard}
		if arch != nil {
			pcfg.Archive = arch
		}
		proj, err = projector.New(store, js, pcfg)
		if err != nil {
			return err
		}
		// Waiting calls come from the views, so every replica running the
		// projector reports the same numbers across restarts; none until
		// the views have caught up (before, reported calls would count).
		labels := l.ToolLabels()
		reg.MustRegister(projector.NewWaitingCollector(store, projector.WaitingConfig{
			Label: labels.CallLabel, Known: labels.Names, Ready: ready0.Load, Logger: log, Grace: l.DeadlineGrace(),
		}))
		// Undecided approvals, likewise from the views (docs/approvals.md#metrics).
		reg.MustRegister(projector.NewApprovalsCollector(store, projector.WaitingConfig{
			Label: labels.CallLabel, Known: labels.Names, Ready: ready0.Load, Logger: log,
		}))
		projCtx, stopProj := context.WithCancel(life)
		projDone := make(chan struct{})
		go func() {
			defer close(projDone)
			if archiver != nil {
				// Entries that expired while serve was down are recorded as
				// lost by the archiver's first pass; the projector then
				// steps over them instead of stopping on a gap.
				select {
				case <-archiver.FirstPass():
				case <-projCtx.Done():
					return
				}
			}
			runProjector(projCtx, proj, log, &ready0, &projErr, &storeBroken)
		}()
		defer func() {
			stopProj()
			<-projDone
			if err := store.Sync(); err != nil {
				log.Error("sync view store", "err", err)
			}
			log.Info("projector stopped", "applied", proj.Applied())
		}()
		// inbox.list: a worker's recovery of the results whose wakeups it
		// missed, answered from the Inbox view (docs/protocol.md#inboxlist).
		papi, err := proj.ServeAPI(life, nc, l, projector.APIConfig{})
		if err != nil {
			return err
		}
		defer papi.Stop()
		httpCfg.Views = projector.NewQueries(store)
		httpCfg.Audit = httpapi.AuditConfig{
			Verify: func(ctx context.Context) (ledger.VerifyReport, error) {
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
	} else {
		ready0.Store(true)
	}
	if s.has("api") {
		api, err := l.ServeAPI(life, ledger.APIConfig{})
		if err != nil {
			return err
		}
		defer api.Stop()
		httpCfg.Registry, httpCfg.Tools = l, httpapi.RegistryConfig{Actor: httpAdminActor}
		httpCfg.Builtins = []*protocol.ToolDefinition{executor.EchoDefinition, executor.SleepDefinition}
		// Every call's deadline, whoever serves its tool: one durable
		// consumer shared by every serve process (docs/protocol.md,
		// "Deadlines").
		keeper, err := l.StartDeadlineKeeper(life, ledger.DeadlineKeeperConfig{Retry: startRetry(log, ctx)})
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := keeper.Stop(sctx); err != nil {
				log.Warn("stop deadline keeper", "err", err)
			}
		}()
		// Held calls' expiry, and the follow-up of a decision whose
		// decider stopped half-way (docs/approvals.md).
		approvals, err := l.StartApprovalKeeper(life, ledger.ApprovalKeeperConfig{Retry: startRetry(log, ctx)})
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := approvals.Stop(sctx); err != nil {
				log.Warn("stop approval keeper", "err", err)
			}
		}()
	}
	drainExecutor := func() {}
	if s.has("executor") {
		var cardKey []byte
		if sa != nil {
			if cardKey, err = sa.keys.DeriveKey("executor result card ids"); err != nil {
				return err
			}
		}
		ackWait, _ := time.ParseDuration(s.AckWait) // validated; empty is the default
		ex, err := executor.New(l, nc, executor.Config{SourceID: s.SourceID, Registerer: reg, Logger: log, CardIDKey: cardKey, AckWait: ackWait, Retry: startRetry(log, ctx)})
		if err != nil {
			return err
		}
		if err := executor.RegisterBuiltins(ex); err != nil {
			return err
		}
		if err := jina.Register(ex, jina.Config{Logger: log}); err != nil {
			return err
		}
		if err := ex.Start(life); err != nil {
			return fmt.Errorf("start executor: %w", err)
		}
		var once sync.Once
		drainExecutor = func() {
			once.Do(func() {
				ex.Stop(context.Background())
				log.Info("executor drained")
			})
		}
		defer drainExecutor()
	}
	if s.has("mcp") {
		var cardKey []byte
		if sa != nil {
			if cardKey, err = sa.keys.DeriveKey("executor result card ids"); err != nil {
				return err
			}
		}
		stop, err := startMCPBridge(life, s, l, nc, log, cardKey)
		if err != nil {
			return err
		}
		prev := drainExecutor
		drainExecutor = func() { stop(); prev() }
		defer stop()
	}

	// The ledger as an MCP server (docs/mcp.md): each call goes to the
	// ledger API over NATS as the path's agent, as the agent's own
	// dispatch would, wherever the API is served; the HTTP policy checks
	// the bearer's project and agent first.
	httpCfg.MCP = mcpfront.Handler(mcpfront.HTTPConfig{
		Ledger:    func(_, agent string) mcpfront.Ledger { return client.New(nc, client.WithActor(agent)) },
		Subscribe: natsSubscribe(nc),
		Builtins:  mcpBuiltins(), Logger: log, Version: version, CloseStreamAfter: s.mcpStreamPollAfter(),
	})
	httpCfg.Export = func(ctx context.Context, w io.Writer, from uint64) error {
		_, err := ledger.ExportHistory(ctx, hist, l.StreamName(), w, from)
		return err
	}
	httpCfg.Logger = log
	httpCfg.Healthy = nc.IsConnected
	httpCfg.Readiness = func(r *http.Request) (map[string]any, bool) {
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
		if shuttingDown.Load() {
			body["status"], body["reason"] = "not ready", "shutting down"
			return body, false
		}
		if !ready0.Load() || !nc.IsConnected() {
			reason, _ := projErr.Load().(string)
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
		if storeBroken.Load() {
			// Pebble cannot be trusted after a failed write, even if a later
			// commit went through: not ready until serve has restarted.
			body["status"], body["reason"] = "not ready", "view store broken by a failed write: serve restarts itself in place once the disk has room"
			return body, false
		}
		return body, true
	}
	httpCfg.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	router := httpapi.New(httpCfg)
	if s.PProf != "" {
		stopPprof, err := servePprof(s.PProf, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	httpScheme := "http://"
	if serverTLS != nil {
		ln = tls.NewListener(ln, serverTLS)
		httpScheme = "https://"
	}
	var handler http.Handler = router
	if sa != nil {
		handler = sa.policy.Wrap(router)
	}
	handler = mcpfront.OriginGuard(handler)
	handler = instrumentHTTP(reg, router.Mux(), handler)
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	log.Info("cgledger serving", "nats", url, "http", httpScheme+ln.Addr().String(), "data", s.Data, "auth", !s.NoAuth,
		"roles", s.Roles, "stream", l.StreamName(), "replicas", s.Replicas, "sync_always", s.SyncAlways)
	if ready != nil {
		ready(serving{HTTP: httpScheme + ln.Addr().String(), NATS: url, Embedded: embeddedSrv})
	}

	<-ctx.Done()
	// Order: readiness says "shutting down"; the executor drains (stops
	// pulling, finishes the calls it runs, which report through the ledger);
	// the projector catches up with the stream, so those results are
	// visible; HTTP keeps answering for a second more (a client polling for
	// its result reads it), then finishes its requests and stops. Then,
	// deferred in reverse: the API stops after its in-flight requests, the
	// projector stops and syncs its checkpoint, the view store closes, the
	// ledger finishes its background record marks, the NATS connection
	// drains, the embedded server stops.
	shuttingDown.Store(true)
	log.Info("shutting down: finishing calls in flight; HTTP and the API stay up until they are reported")
	drainExecutor()
	if proj != nil {
		catchUp(js, l.StreamName(), proj, 10*time.Second, log)
	}
	grace := time.NewTimer(time.Second)
	<-grace.C
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = hs.Shutdown(shutCtx)
	log.Info("http server stopped")
	return nil
}

// catchUp waits, up to limit, until the projector has applied the stream's
// last entry as of now: the reports of the calls just drained.
func catchUp(js jetstream.JetStream, stream string, proj *projector.Projector, limit time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		log.Warn("shutdown: cannot read the stream's last sequence", "err", err)
		return
	}
	last := st.CachedInfo().State.LastSeq
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for proj.Applied() < last {
		select {
		case <-ctx.Done():
			log.Warn("shutdown: projector did not catch up in time", "applied", proj.Applied(), "last_seq", last)
			return
		case <-tick.C:
		}
	}
}

// runProjector keeps the projector following the ledger: ready means caught
// up at start. Transient failures are retried with backoff; a corrupt entry
// waits (not ready) until an operator's skip entry names it; a gap stops for
// good.
func runProjector(ctx context.Context, proj *projector.Projector, log *slog.Logger, ready *atomic.Bool, reason *atomic.Value, storeBroken *atomic.Bool) {
	for {
		for wait := backoff.New(100*time.Millisecond, 5*time.Second); ; {
			err := proj.CatchUp(ctx)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				break
			}
			reason.Store(err.Error())
			log.Error("projector catch-up failed", "err", err)
			if errors.Is(err, projector.ErrStoreBroken) {
				// Nothing more is written to a store that failed a write:
				// serve restarts in place, reopening it, once there is room.
				storeBroken.Store(true)
				return
			}
			if projector.Fatal(err) {
				if !waitSkip(ctx, proj, log, err) {
					return
				}
				continue
			}
			if wait.Wait(ctx) != nil {
				return
			}
		}
		reason.Store("")
		ready.Store(true)
		log.Info("projector caught up", "applied", proj.Applied())
		err := proj.Run(ctx)
		if ctx.Err() != nil || err == nil {
			return
		}
		ready.Store(false)
		reason.Store(err.Error())
		log.Error("projector stopped", "err", err)
		if errors.Is(err, projector.ErrStoreBroken) {
			storeBroken.Store(true)
			return
		}
		if projector.Fatal(err) && !waitSkip(ctx, proj, log, err) {
			return
		}
	}
}

// waitSkip waits for an operator's skip of the entry the projector stopped
// at; false means it cannot be skipped (a gap) or the server is stopping.
func waitSkip(ctx context.Context, proj *projector.Projector, log *slog.Logger, stop error) bool {
	log.Warn("projector stopped on an entry it cannot apply; waiting for `cgledger projector skip --seq N --reason ...` (docs/views.md)", "err", stop)
	if err := proj.WaitForSkip(ctx, stop); err != nil {
		if ctx.Err() == nil {
			log.Error("projector cannot continue", "err", err)
		}
		return false
	}
	log.Info("skip entry found: projector continues")
	return true
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

// checkRebuild refuses to empty views of another format (fc) for a rebuild
// when the ledger cannot give back every entry they hold: the stream is
// missing, re-created or shorter than the views, or entries they applied
// were lost before they were archived. Nothing is changed then, and the
// error says what to do.
func checkRebuild(ctx context.Context, js jetstream.JetStream, data, views string, fc projector.FormatChange) error {
	if _, err := checkLedgerStream(ctx, js, ledger.DefaultStream, data, fc.Applied); err != nil {
		return fmt.Errorf("views in %s must be rebuilt (%s), and this ledger cannot give them back: %w; they are left as they are: restore the stream from backup or replay an export (docs/security.md, \"Recovery\"), or remove %s to rebuild from the stream as it is", views, fc.Reason, err, views)
	}
	dir := filepath.Join(data, "archive")
	var gone [][2]uint64 // what the ledger cannot give back, in [1, applied]
	archived := uint64(0)
	if _, err := os.Stat(dir); err == nil {
		arch, err := archive.Open(dir)
		if err != nil {
			return err
		}
		lost, err := arch.Lost()
		if err != nil {
			return err
		}
		gone = append(gone, lost...)
		if archived, err = arch.LastSeq(); err != nil {
			return err
		}
	}
	// Entries past the archive that the stream no longer has expired
	// unarchived, recorded yet or not.
	st, err := js.Stream(ctx, ledger.DefaultStream)
	if err != nil {
		return fmt.Errorf("read stream %s: %w", ledger.DefaultStream, err)
	}
	info, err := st.Info(ctx, jetstream.WithDeletedDetails(true))
	if err != nil {
		return fmt.Errorf("read stream %s: %w", ledger.DefaultStream, err)
	}
	if first := info.State.FirstSeq; first > archived+1 {
		gone = append(gone, [2]uint64{archived + 1, first - 1})
	}
	for _, seq := range info.State.Deleted {
		if seq > archived {
			gone = append(gone, [2]uint64{seq, seq})
		}
	}
	var held []string
	for _, r := range gone {
		for _, part := range subtractRanges([2]uint64{r[0], min(r[1], fc.Applied)}, fc.Lost) {
			held = append(held, fmt.Sprintf("%d-%d", part[0], part[1]))
		}
	}
	if len(held) > 0 {
		if len(held) > 10 {
			held = append(held[:10], fmt.Sprintf("and %d more", len(held)-10))
		}
		return fmt.Errorf("views in %s must be rebuilt (%s), but they hold entries %s, which expired before they were archived and would be gone from the rebuilt views; "+
			"keep running the previous release to keep them, or remove %s to rebuild without them",
			views, fc.Reason, strings.Join(held, ", "), views)
	}
	return nil
}

// subtractRanges returns the parts of r (first, last; empty when first >
// last) outside every range of cut.
func subtractRanges(r [2]uint64, cut [][2]uint64) [][2]uint64 {
	if r[0] > r[1] {
		return nil
	}
	parts := [][2]uint64{r}
	for _, c := range cut {
		var next [][2]uint64
		for _, p := range parts {
			if c[1] < p[0] || c[0] > p[1] {
				next = append(next, p)
				continue
			}
			if c[0] > p[0] {
				next = append(next, [2]uint64{p[0], c[0] - 1})
			}
			if c[1] < p[1] {
				next = append(next, [2]uint64{c[1] + 1, p[1]})
			}
		}
		parts = next
	}
	return parts
}

// openHistory returns where the ledger's history is read from: the stream
// alone, or, when retention is on or an archive was written before, the
// archive's sealed segments and then the stream.
func openHistory(js jetstream.JetStream, stream, dir string, retention bool) (ledger.History, *archive.Archive, error) {
	if !retention {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return ledger.StreamHistory{JS: js, Stream: stream}, nil, nil
		}
	}
	arch, err := archive.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	return archive.History{Archive: arch, JS: js, Stream: stream}, arch, nil
}
