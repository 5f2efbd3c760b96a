package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/archive"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/executor/jina"
	"github.com/cgledger/cgledger/internal/diskspace"
	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// serveState is what serve's components share: each component's Start
// fills in what it brings up (the connection, the ledger, the views...),
// and the components after it in the start order read it.
type serveState struct {
	s        Settings
	log      *slog.Logger
	ready    func(serving)
	embedded bool
	// url is the NATS server's URL: the external one, or the embedded
	// server's once it listens.
	url string

	ln        net.Listener
	sa        *serveAuth
	serverTLS *tls.Config

	srv        *server.Server
	storageLog *natsserver.StorageLog
	nc         *nats.Conn
	js         jetstream.JetStream
	reg        *prometheus.Registry

	store        *projector.Store
	viewsApplied uint64

	guard                  *diskspace.Guard
	ledgerGuard, viewGuard func() error
	retention              time.Duration
	l                      *ledger.Ledger

	hist     stream.History
	arch     *archive.Archive
	archiver *archive.Archiver

	// life is the context of the parts that serve work: they live until
	// the shutdown stops them, in order, not until the signal, so that a
	// call in flight is finished, reported and visible before HTTP and the
	// API stop.
	life context.Context

	proj *projector.Projector
	// snapshotNow takes a snapshot of the views now (views.snapshot); nil
	// until the views snapshotter starts.
	snapshotNow func(context.Context) (protocol.ViewsSnapshotResult, error)
	// snapshotList lists the snapshots in the target (views.snapshot.list).
	snapshotList func(context.Context) (protocol.ViewsSnapshotListResult, error)
	// stopSnapshots abandons a snapshot of the views in progress at the
	// shutdown's first step, so that it does not hold the shutdown.
	stopSnapshots context.CancelFunc
	hs            *http.Server
	// router is serve's whole HTTP handler (serveHTTPHandler).
	router http.Handler
	// stopPprof closes pprof once it serves (--pprof).
	stopPprof func()

	// ready0 is the projector caught up (true without the projector role);
	// projErr why it is not; storeBroken the view store failed a write.
	ready0, storeBroken atomic.Bool
	projErr             atomic.Value
	// serving is set once HTTP serves the whole router, shuttingDown once
	// the shutdown began: the steps that only a started serve takes on its
	// way down (the projector's catch-up, HTTP's grace) check them.
	serving, shuttingDown atomic.Bool

	// handler is what HTTP serves: startingHandler until servingComponent
	// puts the whole router there. conn is nc for the HTTP handlers, which
	// run beside the start-up (set once connected).
	handler atomic.Pointer[handlerSlot]
	conn    atomic.Pointer[nats.Conn]
	// startPart names the component being started and startStep the step
	// (restoringStep while the views are restored), for /readyz while
	// serve starts.
	startPart, startStep atomic.Value
}

// serveComponents lists serve's components in start order; reversed, it is
// the shutdown order: readiness says "shutting down"; the MCP bridge and
// the executor drain (stop pulling commands, finish the calls they run,
// which report through the ledger); the projector catches up with the
// stream, so those results are visible; HTTP keeps answering for a second
// more (a client polling for its result reads it), then finishes its
// requests and stops; pprof stops; the keepers and the API stop after their
// in-flight requests; the projector stops and syncs its checkpoint; the
// archiver seals what was written; the ledger finishes its background
// record marks; the view store closes; the NATS connection drains; the
// embedded server stops last.
func serveComponents(st *serveState) *group {
	s := st.s
	g := &group{starting: func(name string) { st.startPart.Store(name) }}
	g.add("data directory lock", &lockComponent{st: st})
	g.add("http listener", &listenerComponent{st: st})
	g.add("security", hooks{start: st.setupSecurity})
	g.add("http while starting", &startingHTTPComponent{st: st})
	if st.embedded {
		g.add("embedded nats-server", &embeddedNATS{st: st})
	}
	g.add("nats connection", &natsComponent{st: st})
	if s.has("projector") {
		g.add("view store", &viewStoreComponent{st: st})
	}
	g.add("ledger", &ledgerComponent{st: st})
	g.add("archive", &archiveComponent{st: st})
	g.add("storage supervisor", hooks{start: st.superviseStorage})
	g.add("work context", &lifeComponent{st: st})
	if s.has("projector") {
		g.add("projector", &projectorComponent{st: st})
		g.add("views snapshotter", &viewsSnapshotter{st: st})
		g.add("inbox API", &inboxAPIComponent{st: st})
	} else {
		st.ready0.Store(true)
	}
	if s.has("api") {
		g.add("ledger API", &apiComponent{st: st})
		g.add("deadline keeper", &deadlineKeeperComponent{st: st})
		g.add("approval keeper", &approvalKeeperComponent{st: st})
		g.add("report sweeper", &sweeperComponent{st: st})
	}
	if s.PProf != "" {
		g.add("pprof", &pprofComponent{st: st})
	}
	g.add("http server", &httpComponent{st: st})
	if s.has("projector") {
		g.add("projector catch-up", hooks{stop: st.catchUpOnShutdown})
	}
	if s.has("executor") {
		g.add("executor", &executorComponent{st: st})
	}
	if s.has("mcp") {
		g.add("mcp bridge", &mcpComponent{st: st})
	}
	g.add("serving", &servingComponent{st: st})
	return g
}

// lockComponent holds the data directory: preflight's checks, and its lock
// until the very end.
type lockComponent struct {
	st     *serveState
	unlock func()
}

// Start checks the data directory and ports and takes the lock.
func (c *lockComponent) Start(context.Context) error {
	unlock, err := preflight(c.st.s, c.st.embedded)
	if err != nil {
		return err
	}
	c.unlock = unlock
	return nil
}

// Stop releases the lock.
func (c *lockComponent) Stop(context.Context) error {
	c.unlock()
	return nil
}

// listenerComponent listens for HTTP first: a port in use is reported
// before anything starts.
type listenerComponent struct{ st *serveState }

// Start listens on http_listen.
func (c *listenerComponent) Start(context.Context) error {
	ln, err := net.Listen("tcp", c.st.s.HTTPListen)
	if err != nil {
		return fmt.Errorf("http_listen %q: %w", c.st.s.HTTPListen, err)
	}
	c.st.ln = ln
	return nil
}

// Stop closes the listener.
func (c *listenerComponent) Stop(context.Context) error {
	_ = c.st.ln.Close()
	return nil
}

// setupSecurity loads the keys and the TLS configuration, and sets the
// memory limit and the collector's target (bench runs serve through here,
// so it measures the same).
func (st *serveState) setupSecurity(context.Context) error {
	s, log := st.s, st.log
	var err error
	if s.NoAuth {
		log.Warn("authentication is OFF (--no-auth): anyone who reaches NATS or HTTP can forge, halt or delete the ledger; see docs/security.md")
	} else {
		if st.sa, err = setupAuth(s.Data, st.embedded, log); err != nil {
			if !st.embedded {
				return fmt.Errorf("HTTP authentication needs the ledger account's keys in %s (see docs/security.md, \"External cluster\"), or --no-auth: %w", authDir(s.Data), err)
			}
			return err
		}
	}
	if st.serverTLS, err = loadTLS(s.TLSCert, s.TLSKey, s.TLSCA, true); err != nil {
		return err
	}
	// A soft memory limit bounds the heap that gc_percent lets grow. auto
	// scales it with the machine: what the ledger holds grows with history
	// (the stream's subject index), and a limit close to it makes the
	// collector run without pause (docs/decisions.md).
	if os.Getenv("GOMEMLIMIT") != "" {
		// The runtime's "no limit" is the largest int64: logged as 0, none.
		limit, from := debug.SetMemoryLimit(-1), "GOMEMLIMIT in the environment"
		if limit == math.MaxInt64 {
			limit, from = 0, "GOMEMLIMIT in the environment: off, no limit"
		}
		log.Info("memory limit", "mib", limit>>20, "from", from)
	} else {
		limit, from := resolveMemoryLimit(s.MemoryLimit)
		if limit > 0 {
			debug.SetMemoryLimit(int64(limit))
		}
		log.Info("memory limit", "mib", limit>>20, "from", from)
	}
	// Most of what a tool call allocates is garbage by the time it is
	// answered while the live heap stays small, so at Go's default target
	// the collector runs often for little: a larger target trades memory
	// (capped by the limit above) for CPU.
	gogc := os.Getenv("GOGC")
	switch pct, _ := parseGCPercent(s.GCPercent); { // validated
	case gogc != "":
		log.Info("gc percent", "value", gogc, "from", "GOGC in the environment")
	case pct == 0:
		log.Info("gc percent", "value", "100", "from", "the Go runtime's default (gc_percent empty)")
	default:
		debug.SetGCPercent(pct)
		log.Info("gc percent", "value", s.GCPercent, "from", "gc_percent")
	}
	return nil
}

// embeddedNATS is the embedded JetStream nats-server (without --nats-url).
type embeddedNATS struct{ st *serveState }

// Start starts the server and sets the URL the connection dials.
func (c *embeddedNATS) Start(context.Context) error {
	st, s := c.st, c.st.s
	host, portStr, _ := net.SplitHostPort(s.NATSListen)
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("nats_listen %q: bad port: %w", s.NATSListen, err)
	}
	storeDir, err := filepath.Abs(filepath.Join(s.Data, "jetstream"))
	if err != nil {
		return fmt.Errorf("data %q: %w", s.Data, err)
	}
	st.storageLog = &natsserver.StorageLog{Log: st.log}
	cfg := natsserver.Config{StoreDir: storeDir, Host: host, Port: port, SyncAlways: s.SyncAlways, TLS: st.serverTLS, Logger: st.storageLog}
	if st.sa != nil {
		cfg.Trust = st.sa.trust
	}
	if s.SyncInterval != "" {
		cfg.SyncInterval, _ = time.ParseDuration(s.SyncInterval)
	}
	srv, err := natsserver.Start(cfg)
	if err != nil {
		return fmt.Errorf("start embedded nats-server: %w", err)
	}
	st.srv = srv
	scheme := "nats://"
	if st.serverTLS != nil {
		scheme = "tls://"
	}
	st.url = scheme + srv.Addr().String()
	return nil
}

// Stop shuts the server down, last of all.
func (c *embeddedNATS) Stop(context.Context) error {
	c.st.srv.Shutdown()
	c.st.srv.WaitForShutdown()
	c.st.log.Info("embedded nats-server stopped")
	return nil
}

// natsComponent is serve's NATS connection, its JetStream context and its
// metrics registry.
type natsComponent struct{ st *serveState }

// Start connects.
func (c *natsComponent) Start(context.Context) error {
	st, s := c.st, c.st.s
	opts := natsOptions(s, "cgledger-serve")
	if st.embedded && st.sa != nil {
		opts = append(opts, nats.UserJWTAndSeed(st.sa.ledger.JWT, st.sa.ledger.Seed))
	}
	if clientTLS, err := loadTLS(s.TLSCert, s.TLSKey, s.TLSCA, false); err != nil {
		return err
	} else if clientTLS != nil {
		if st.embedded && s.TLSCA == "" {
			// The embedded server's certificate is ours; without a CA to check
			// it against, trust it as the server we just started.
			clientTLS.InsecureSkipVerify = true //nolint:gosec // loopback to our own listener
		}
		opts = append(opts, nats.Secure(clientTLS))
	}
	nc, err := nats.Connect(st.url, opts...)
	if err != nil {
		if !st.embedded && os.Getenv("CGLEDGER_NATS_URL") != "" {
			return fmt.Errorf("connect %s (from CGLEDGER_NATS_URL: with it set, serve uses that server instead of starting the embedded one): %w", st.url, err)
		}
		return fmt.Errorf("connect %s: %w", st.url, err)
	}
	st.nc = nc
	st.conn.Store(nc)
	if st.js, err = jetstream.New(nc); err != nil {
		c.close()
		return fmt.Errorf("jetstream: %w", err)
	}
	return nil
}

// Stop drains the connection, after every part that uses it stopped.
func (c *natsComponent) Stop(context.Context) error {
	c.close()
	return nil
}

func (c *natsComponent) close() {
	if err := c.st.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		c.st.log.Warn("nats drain", "err", err)
	}
	c.st.nc.Close()
}

// viewStoreComponent is the projector's view store (Pebble, under
// <data>/views).
type viewStoreComponent struct{ st *serveState }

// Start opens the store; views of another format are emptied for a
// rebuild once the ledger is known to hold every entry they did.
func (c *viewStoreComponent) Start(ctx context.Context) error {
	st, log := c.st, c.st.log
	views := filepath.Join(st.s.Data, "views")
	if err := settleRestore(st.s.Data); err != nil {
		return err
	}
	// Views missing, or of another format, are restored from a snapshot
	// when one passes its checks (views_restore), else rebuilt.
	tryRestore := st.s.ViewsRestore
	none, err := dirEmpty(views)
	if err != nil {
		return err
	}
	if tryRestore && none {
		tryRestore = false
		if _, err := st.restoreViews(ctx, "no views"); err != nil {
			return err
		}
	}
	// Views of another format are emptied and rebuilt from the ledger:
	// first make sure that the ledger still has every entry they hold.
	opts := projector.StoreOptions{BackgroundError: backgroundErrorLog(log), Corruption: corruptionLog(log), BeforeRebuild: func(fc projector.FormatChange) error {
		if tryRestore {
			return errRestoreFirst{fc: fc}
		}
		return untilClusterAnswers(ctx, log, "check the ledger before rebuilding the views", func() error {
			return checkRebuild(ctx, st.js, st.s.Data, views, fc)
		})
	}}
	store, err := projector.OpenStore(views, opts)
	var first errRestoreFirst
	if errors.As(err, &first) {
		tryRestore = false
		if _, err := st.restoreViews(ctx, fmt.Sprintf("views of format %d: %s", first.fc.From, first.fc.Reason)); err != nil {
			return err
		}
		store, err = projector.OpenStore(views, opts)
	}
	if err != nil {
		return err
	}
	if applied, aerr := store.Applied(); tryRestore && aerr == nil && applied == 0 && store.FormatChange() == nil {
		// Views that never applied an entry (a start killed before its
		// first batch) are as good as none.
		tryRestore = false
		if err := store.Close(); err != nil {
			return fmt.Errorf("close empty views to restore a snapshot: %w", err)
		}
		if _, err := st.restoreViews(ctx, "empty views"); err != nil {
			return err
		}
		if store, err = projector.OpenStore(views, opts); err != nil {
			return err
		}
	}
	st.store = store
	if fc := store.FormatChange(); fc != nil {
		log.Warn("views format changed: rebuilding the views from the ledger", "reason", fc.Reason, "from_format", fc.From, "format", projector.ViewsFormat)
	}
	if st.viewsApplied, err = store.Applied(); err != nil {
		_ = c.Stop(ctx)
		return err
	}
	if fc := store.FormatChange(); fc != nil {
		// The emptied views still tell how far the ledger had come.
		st.viewsApplied = fc.Applied
	}
	return nil
}

// Stop closes the store.
func (c *viewStoreComponent) Stop(context.Context) error {
	if err := c.st.store.Close(); err != nil {
		c.st.log.Error("close view store", "err", err)
	}
	return nil
}

// ledgerComponent is the ledger (the writer): its stream checked against
// the data directory's record, the disk guard of its writes, and its
// metrics.
type ledgerComponent struct{ st *serveState }

// Start checks the stream and opens the ledger. Every start-up step that
// talks to JetStream runs under serve's start-up policy
// (untilClusterAnswers): on a cluster electing a leader serve waits, not
// ready, instead of exiting.
func (c *ledgerComponent) Start(ctx context.Context) error {
	st, s, log := c.st, c.st.s, c.st.log
	var recorded bool
	if err := untilClusterAnswers(ctx, log, "read the ledger stream", func() (err error) {
		recorded, err = checkLedgerStream(ctx, st.js, stream.DefaultName, s.Data, st.viewsApplied)
		return err
	}); err != nil {
		return err
	}
	// Writes stop before the data directory's disk is full: JetStream
	// disables itself and Pebble cannot continue after a failed write.
	if st.embedded || s.has("projector") {
		reserve, _ := diskspace.ParseSize(s.DiskReserve) // validated; empty and off are 0
		guard := diskspace.New(s.Data, reserve, s.DiskReserve == "off")
		st.guard = guard
		if st.embedded {
			st.ledgerGuard = func() error { return storageTrouble(guard, st.srv, st.storageLog) }
		}
		if s.has("projector") {
			st.viewGuard = guard.Check
		}
		st.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "cgledger_data_free_bytes",
			Help: "Free bytes on the file system of the data directory; writes stop below the reserve (docs/durability.md).",
		}, func() float64 { _ = guard.Check(); return float64(guard.Free()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "cgledger_data_reserve_bytes",
				Help: "The disk reserve: free bytes on the data directory's file system below which writes stop (disk_reserve, else the smaller of 64 MiB and 10% of the file system; 0 when the check is off). Alerts compare cgledger_data_free_bytes with it.",
			}, func() float64 { _ = guard.Check(); return float64(guard.Reserve()) }))
	}
	st.retention, _ = parseDays(s.Retention)            // validated
	toolAckWait, _ := time.ParseDuration(s.ToolAckWait) // validated; empty is the ledger's default
	l, err := openLedger(ctx, st.nc, ledger.Config{Registerer: st.reg, Logger: log, Streams: stream.Config{Replicas: s.Replicas, ManagedRetention: true}, WriteGuard: st.ledgerGuard, Retention: st.retention, ToolAckWait: toolAckWait,
		BuiltinTools: []protocol.ToolDefinition{*executor.EchoDefinition, *executor.SleepDefinition}}, log)
	if err != nil {
		return err
	}
	st.l = l
	registerServeMetrics(st.reg, st.nc, st.js, l.ToolLabels(), l.StreamName(), "KV_"+l.BucketName())
	st.reg.MustRegister(l.ToolCollector())
	if !recorded {
		if err := untilClusterAnswers(ctx, log, "record the ledger stream", func() error {
			return recordLedgerStream(ctx, st.js, l.StreamName(), s.Data)
		}); err != nil {
			l.Close()
			return err
		}
	}
	return nil
}

// Stop closes the ledger after the executor and the API have stopped:
// it finishes marking answered calls before the connection drains.
func (c *ledgerComponent) Stop(context.Context) error {
	c.st.l.Close()
	return nil
}

// archiveComponent is where history older than the retention window lives:
// the archive and the archiver that fills it.
type archiveComponent struct {
	st          *serveState
	stopArchive context.CancelFunc
	done        chan struct{}
}

// Start opens the history and starts the archiver, or, with no archive,
// applies the stream's retention.
func (c *archiveComponent) Start(ctx context.Context) error {
	st, s, log := c.st, c.st.s, c.st.log
	sealAge, _ := parseDays(s.ArchiveSeal)
	hist, arch, err := openHistory(st.js, st.l.StreamName(), filepath.Join(s.Data, "archive"), st.retention > 0)
	if err != nil {
		return err
	}
	st.hist, st.arch = hist, arch
	if st.retention == 0 && arch != nil {
		// Entries written while retention was set still expire on their
		// own TTL: the archiver goes on copying them (and every later
		// entry) so that none expires unarchived.
		log.Warn("retention is off but the data directory has an archive: archiving goes on, so that entries written with a retention window are archived before they expire", "archive", filepath.Join(s.Data, "archive"))
	}
	if arch == nil {
		return untilClusterAnswers(ctx, log, "apply retention", func() error {
			return stream.ApplyRetention(ctx, st.js, stream.Config{Replicas: s.Replicas}, 0)
		})
	}
	acfg := archive.Config{Streams: stream.Config{Replicas: s.Replicas}, Retention: st.retention, SealAge: sealAge, Logger: log, Registerer: st.reg}
	if st.store != nil {
		acfg.LinkAt = st.store.LinkAt
	}
	if st.archiver, err = archive.New(arch, st.js, acfg); err != nil {
		return err
	}
	archCtx, stopArchiver := context.WithCancel(context.WithoutCancel(ctx))
	c.stopArchive, c.done = stopArchiver, make(chan struct{})
	go func() {
		defer close(c.done)
		_ = st.archiver.Run(archCtx)
	}()
	return nil
}

// Stop stops the archiver, last of the parts that read the stream, so that
// it seals every entry written before the shutdown.
func (c *archiveComponent) Stop(context.Context) error {
	if c.stopArchive == nil {
		return nil
	}
	c.stopArchive()
	<-c.done
	c.st.log.Info("archiver stopped", "sealed_seq", c.st.archiver.Sealed())
	return nil
}

// superviseStorage registers the storage-degraded gauge and, in the serve
// command, restarts serve in place once storage a failed write broke has
// room again. The supervisor ends with ctx: at the signal.
func (st *serveState) superviseStorage(ctx context.Context) error {
	if st.guard == nil {
		return nil
	}
	st.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cgledger_storage_degraded",
		Help: "1 while the data directory's storage takes no writes (free space below the reserve, the embedded server's stream failed by a write error, the last ledger write refused for want of storage, or the view store broken); /readyz says why.",
	}, func() float64 {
		if storageTrouble(st.guard, st.srv, st.storageLog) != nil || st.l.StorageFault() != nil || st.storeBroken.Load() {
			return 1
		}
		return 0
	}))
	if st.s.restartInPlace {
		// Only the embedded server is reset by restarting serve: an external
		// server's refusal is for its operator.
		fault := func() error { return nil }
		if st.embedded {
			fault = st.l.StorageFault
		}
		go superviseStorage(ctx, st.log, st.s.Data, st.guard, st.srv, st.storageLog, fault, &st.storeBroken)
	}
	return nil
}

// lifeComponent owns the context of the parts that serve work (see
// serveState.life): it ends once they have all stopped.
type lifeComponent struct {
	st  *serveState
	end context.CancelFunc
}

// Start makes the context.
func (c *lifeComponent) Start(ctx context.Context) error {
	c.st.life, c.end = context.WithCancel(context.WithoutCancel(ctx))
	return nil
}

// Stop ends it.
func (c *lifeComponent) Stop(context.Context) error {
	c.end()
	return nil
}

// projectorComponent keeps the views following the ledger.
type projectorComponent struct {
	st   *serveState
	stop context.CancelFunc
	done chan struct{}
}

// Start makes the projector and its collectors and starts following.
func (c *projectorComponent) Start(context.Context) error {
	st, log := c.st, c.st.log
	pcfg := projector.Config{Stream: st.l.StreamName(), Registerer: st.reg, Logger: log, WriteGuard: st.viewGuard}
	if st.arch != nil {
		pcfg.Archive = st.arch
	}
	proj, err := projector.New(st.store, st.js, pcfg)
	if err != nil {
		return err
	}
	st.proj = proj
	// Waiting calls come from the views, so every replica running the
	// projector reports the same numbers across restarts; none until
	// the views have caught up (before, reported calls would count).
	labels := st.l.ToolLabels()
	st.reg.MustRegister(projector.NewWaitingCollector(st.store, projector.WaitingConfig{
		Label: labels.CallLabel, Known: labels.Names, Ready: st.ready0.Load, Logger: log, Grace: st.l.DeadlineGrace(),
	}))
	// Undecided approvals, likewise from the views (docs/approvals.md#metrics).
	st.reg.MustRegister(projector.NewApprovalsCollector(st.store, projector.WaitingConfig{
		Label: labels.CallLabel, Known: labels.Names, Ready: st.ready0.Load, Logger: log,
	}))
	projCtx, stopProj := context.WithCancel(st.life)
	c.stop, c.done = stopProj, make(chan struct{})
	go func() {
		defer close(c.done)
		if st.archiver != nil {
			// Entries that expired while serve was down are recorded as
			// lost by the archiver's first pass; the projector then
			// steps over them instead of stopping on a gap.
			select {
			case <-st.archiver.FirstPass():
			case <-projCtx.Done():
				return
			}
		}
		runProjector(projCtx, proj, log, &st.ready0, &st.projErr, &st.storeBroken)
	}()
	return nil
}

// Stop stops the projector and syncs its checkpoint.
func (c *projectorComponent) Stop(context.Context) error {
	c.stop()
	<-c.done
	if err := c.st.store.Sync(); err != nil {
		c.st.log.Error("sync view store", "err", err)
	}
	c.st.log.Info("projector stopped", "applied", c.st.proj.Applied())
	return nil
}

// catchUpOnShutdown waits for the projector to apply the reports of the
// calls just drained, so that they are visible before HTTP stops. Only a
// shutdown does: a failed start has drained nothing.
func (st *serveState) catchUpOnShutdown(context.Context) error {
	if st.shuttingDown.Load() {
		catchUp(st.js, st.l.StreamName(), st.proj, 10*time.Second, st.log)
	}
	return nil
}

// inboxAPIComponent answers the views' API operations: inbox.list (a
// worker's recovery of the results whose wakeups it missed, from the Inbox
// view, docs/protocol.md#inboxlist), the approval reads, and
// views.snapshot (the views snapshotter's).
type inboxAPIComponent struct {
	st  *serveState
	api *projector.APIServer
}

// Start subscribes.
func (c *inboxAPIComponent) Start(context.Context) error {
	api, err := c.st.proj.ServeAPI(c.st.life, c.st.nc, c.st.l, projector.APIConfig{Snapshot: c.st.snapshotNow, SnapshotList: c.st.snapshotList})
	if err != nil {
		return err
	}
	c.api = api
	return nil
}

// Stop stops after the requests in flight.
func (c *inboxAPIComponent) Stop(context.Context) error {
	c.api.Stop()
	return nil
}

// apiComponent is the ledger's NATS request/reply API.
type apiComponent struct {
	st  *serveState
	api *ledger.APIServer
}

// Start subscribes.
func (c *apiComponent) Start(context.Context) error {
	api, err := c.st.l.ServeAPI(c.st.life, ledger.APIConfig{})
	if err != nil {
		return err
	}
	c.api = api
	return nil
}

// Stop stops after the requests in flight.
func (c *apiComponent) Stop(context.Context) error {
	c.api.Stop()
	return nil
}

// keeperStopTimeout bounds a keeper's stop.
const keeperStopTimeout = 30 * time.Second

// deadlineKeeperComponent keeps every call's deadline, whoever serves its
// tool: one durable consumer shared by every serve process
// (docs/protocol.md, "Deadlines").
type deadlineKeeperComponent struct {
	st     *serveState
	keeper *ledger.DeadlineKeeper
}

// Start starts the keeper.
func (c *deadlineKeeperComponent) Start(ctx context.Context) error {
	keeper, err := c.st.l.StartDeadlineKeeper(c.st.life, ledger.DeadlineKeeperConfig{Retry: startRetry(c.st.log, ctx)})
	if err != nil {
		return err
	}
	c.keeper = keeper
	return nil
}

// Stop stops it; a keeper that does not stop in time is logged, not a
// failed shutdown.
func (c *deadlineKeeperComponent) Stop(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, keeperStopTimeout)
	defer cancel()
	if err := c.keeper.Stop(sctx); err != nil {
		c.st.log.Warn("stop deadline keeper", "err", err)
	}
	return nil
}

// approvalKeeperComponent expires held calls and follows up a decision
// whose decider stopped half-way (docs/approvals.md).
type approvalKeeperComponent struct {
	st     *serveState
	keeper *ledger.ApprovalKeeper
}

// Start starts the keeper.
func (c *approvalKeeperComponent) Start(ctx context.Context) error {
	keeper, err := c.st.l.StartApprovalKeeper(c.st.life, ledger.ApprovalKeeperConfig{Retry: startRetry(c.st.log, ctx)})
	if err != nil {
		return err
	}
	c.keeper = keeper
	return nil
}

// Stop stops it, as deadlineKeeperComponent.Stop does.
func (c *approvalKeeperComponent) Stop(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, keeperStopTimeout)
	defer cancel()
	if err := c.keeper.Stop(sctx); err != nil {
		c.st.log.Warn("stop approval keeper", "err", err)
	}
	return nil
}

// sweeperComponent finishes reports whose wakeup is missing (their writer
// stopped after the append): at start, then every minute (ledger.Sweep).
// Every serve process runs one; sweeps racing on one ledger stay exact.
type sweeperComponent struct {
	st      *serveState
	sweeper *ledger.Sweeper
}

// Start starts the sweeper; its first sweep runs at once, in the background.
func (c *sweeperComponent) Start(context.Context) error {
	sw, err := c.st.l.StartSweeper(c.st.life, ledger.SweepConfig{})
	if err != nil {
		return err
	}
	c.sweeper = sw
	return nil
}

// Stop stops it, as deadlineKeeperComponent.Stop does.
func (c *sweeperComponent) Stop(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, keeperStopTimeout)
	defer cancel()
	if err := c.sweeper.Stop(sctx); err != nil {
		c.st.log.Warn("stop report sweeper", "err", err)
	}
	return nil
}

// pprofComponent is net/http/pprof on its own listener (--pprof). Like
// the HTTP server, it begins to serve when serve opens (servingComponent,
// where a port in use fails the start after every other part started); its
// place in the list is its place in the shutdown: after HTTP stops.
type pprofComponent struct{ st *serveState }

// Start does nothing: servingComponent serves pprof.
func (c *pprofComponent) Start(context.Context) error { return nil }

// Stop closes pprof, if it served.
func (c *pprofComponent) Stop(context.Context) error {
	if c.st.stopPprof != nil {
		c.st.stopPprof()
	}
	return nil
}

// httpGrace is how long HTTP keeps answering once the calls in flight are
// reported and visible: a client polling for its result reads it.
const httpGrace = time.Second

// httpComponent is the HTTP server's whole router. Start builds it
// (serveHTTPHandler); servingComponent, last in the start order, puts it
// in the place of the start-up handler (startingHTTPComponent).
type httpComponent struct{ st *serveState }

// Start builds the whole router (servingComponent serves it).
func (c *httpComponent) Start(context.Context) error {
	c.st.router = serveHTTPHandler(c.st)
	return nil
}

// Stop gives clients the grace, then finishes the requests in flight and
// stops. A server that never served has nothing to finish.
func (c *httpComponent) Stop(ctx context.Context) error {
	if !c.st.serving.Load() {
		return nil
	}
	grace := time.NewTimer(httpGrace)
	<-grace.C
	shutCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = c.st.hs.Shutdown(shutCtx)
	c.st.log.Info("http server stopped")
	return nil
}

// executorComponent runs the built-in tools (and jina's).
type executorComponent struct {
	st *serveState
	ex *executor.Executor
}

// Start makes the executor and starts pulling commands.
func (c *executorComponent) Start(ctx context.Context) error {
	st, s, log := c.st, c.st.s, c.st.log
	cardKey, err := st.cardIDKey()
	if err != nil {
		return err
	}
	ackWait, _ := time.ParseDuration(s.AckWait) // validated; empty is the default
	ex, err := executor.New(st.l, st.nc, executor.Config{SourceID: s.SourceID, Registerer: st.reg, Logger: log, CardIDKey: cardKey, AckWait: ackWait, Retry: startRetry(log, ctx)})
	if err != nil {
		return err
	}
	if err := executor.RegisterBuiltins(ex); err != nil {
		return err
	}
	if err := jina.Register(ex, jina.Config{Logger: log}); err != nil {
		return err
	}
	if err := ex.Start(st.life); err != nil {
		return fmt.Errorf("start executor: %w", err)
	}
	c.ex = ex
	return nil
}

// Stop drains: it stops pulling and finishes the calls it runs, which
// report through the ledger.
func (c *executorComponent) Stop(context.Context) error {
	c.ex.Stop(context.Background())
	c.st.log.Info("executor drained")
	return nil
}

// cardIDKey is the key the executor's result card ids derive from (none
// without authentication).
func (st *serveState) cardIDKey() ([]byte, error) {
	if st.sa == nil {
		return nil, nil
	}
	return st.sa.keys.DeriveKey("executor result card ids")
}

// mcpComponent is the MCP bridge of the mcp role (docs/mcp.md).
type mcpComponent struct {
	st   *serveState
	stop func()
}

// Start starts the bridge.
func (c *mcpComponent) Start(context.Context) error {
	cardKey, err := c.st.cardIDKey()
	if err != nil {
		return err
	}
	stop, err := startMCPBridge(c.st.life, c.st.s, c.st.l, c.st.nc, c.st.log, cardKey)
	if err != nil {
		return err
	}
	c.stop = stop
	return nil
}

// Stop drains the bridge, before the executor.
func (c *mcpComponent) Stop(context.Context) error {
	c.stop()
	return nil
}

// servingComponent opens the door once everything else runs: pprof (with
// --pprof) serves, HTTP serves the whole router, the log says so and ready
// is told. Its stop, the
// first of the shutdown, makes readiness say "shutting down".
type servingComponent struct{ st *serveState }

// Start serves pprof and HTTP's whole router.
func (c *servingComponent) Start(context.Context) error {
	st, s := c.st, c.st.s
	if s.PProf != "" {
		stop, err := servePprof(s.PProf, st.log)
		if err != nil {
			return err
		}
		st.stopPprof = stop
	}
	st.handler.Store(&handlerSlot{h: st.router})
	st.serving.Store(true)
	st.log.Info("cgledger serving", "nats", st.url, "http", st.httpURL(), "data", s.Data, "auth", !s.NoAuth,
		"roles", s.Roles, "stream", st.l.StreamName(), "replicas", s.Replicas, "sync_always", s.SyncAlways)
	if st.ready != nil {
		st.ready(serving{HTTP: st.httpURL(), NATS: st.url, Embedded: st.srv})
	}
	return nil
}

// Stop begins the shutdown: readiness says so, and HTTP and the API stay
// up until the calls in flight are reported.
func (c *servingComponent) Stop(context.Context) error {
	c.st.shuttingDown.Store(true)
	if c.st.stopSnapshots != nil {
		c.st.stopSnapshots()
	}
	c.st.log.Info("shutting down: finishing calls in flight; HTTP and the API stay up until they are reported")
	return nil
}
