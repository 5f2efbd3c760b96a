package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/projector"
)

type serveFlags struct {
	data         string
	natsListen   string
	httpListen   string
	syncAlways   bool
	syncInterval time.Duration
	logFormat    string
}

func serve(args []string) int {
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&f.data, "data", "./data", "directory for the embedded JetStream store")
	fs.StringVar(&f.natsListen, "nats-listen", "127.0.0.1:4222", "address the embedded nats-server listens on")
	fs.StringVar(&f.httpListen, "http-listen", "127.0.0.1:8080", "address of the HTTP server (/healthz, /metrics)")
	fs.BoolVar(&f.syncAlways, "sync-always", false, "fsync every JetStream write before acknowledging it (durable across host crashes, much slower; see docs/durability.md)")
	fs.DurationVar(&f.syncInterval, "sync-interval", 0, "JetStream fsync interval (0 keeps nats-server's 2m default)")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var handler slog.Handler = slog.NewTextHandler(os.Stderr, nil)
	if f.logFormat == "json" {
		handler = slog.NewJSONHandler(os.Stderr, nil)
	}
	log := slog.New(handler)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := runServe(ctx, f, log); err != nil {
		log.Error("serve failed", "err", err)
		return 1
	}
	return 0
}

func runServe(ctx context.Context, f serveFlags, log *slog.Logger) error {
	host, portStr, err := net.SplitHostPort(f.natsListen)
	if err != nil {
		return fmt.Errorf("--nats-listen %q: %w", f.natsListen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("--nats-listen %q: bad port: %w", f.natsListen, err)
	}
	storeDir, err := filepath.Abs(filepath.Join(f.data, "jetstream"))
	if err != nil {
		return fmt.Errorf("--data %q: %w", f.data, err)
	}
	srv, err := natsserver.Start(natsserver.Config{StoreDir: storeDir, Host: host, Port: port, SyncAlways: f.syncAlways, SyncInterval: f.syncInterval})
	if err != nil {
		return fmt.Errorf("start embedded nats-server: %w", err)
	}
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		log.Info("embedded nats-server stopped")
	}()
	url := "nats://" + srv.Addr().String()
	nc, err := nats.Connect(url, nats.Name("cgledger-serve"))
	if err != nil {
		return fmt.Errorf("connect %s: %w", url, err)
	}
	defer nc.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	l, err := ledger.Open(ctx, nc, ledger.Config{Registerer: reg, Logger: log})
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	store, err := projector.OpenStore(filepath.Join(f.data, "views"), projector.StoreOptions{})
	if err != nil {
		return err
	}
	defer func() {
		if err := store.Close(); err != nil {
			log.Error("close view store", "err", err)
		}
	}()
	proj, err := projector.New(store, js, projector.Config{Stream: l.StreamName(), Registerer: reg, Logger: log})
	if err != nil {
		return err
	}
	var ready atomic.Bool
	var projErr atomic.Value
	projCtx, stopProj := context.WithCancel(ctx)
	projDone := make(chan struct{})
	go func() {
		defer close(projDone)
		if err := proj.CatchUp(projCtx); err != nil {
			projErr.Store(err.Error())
			log.Error("projector catch-up failed", "err", err)
			if projector.Fatal(err) {
				return
			}
		} else {
			ready.Store(true)
			log.Info("projector caught up", "applied", proj.Applied())
		}
		if err := proj.Run(projCtx); err != nil {
			ready.Store(false)
			projErr.Store(err.Error())
			log.Error("projector stopped", "err", err)
		}
	}()
	defer func() {
		stopProj()
		<-projDone
		if err := store.Sync(); err != nil {
			log.Error("sync view store", "err", err)
		}
	}()
	api, err := l.ServeAPI(ctx, ledger.APIConfig{})
	if err != nil {
		return err
	}
	defer api.Stop()

	ex, err := executor.New(l, nc, executor.Config{Registerer: reg, Logger: log})
	if err != nil {
		return err
	}
	if err := executor.RegisterBuiltins(ex, executor.HTTPToolConfig{Logger: log}); err != nil {
		return err
	}
	if err := ex.Start(ctx); err != nil {
		return fmt.Errorf("start executor: %w", err)
	}
	// Stopped first on shutdown: stop pulling, drain in-flight calls.
	defer ex.Stop(context.Background())

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !nc.IsConnected() {
			http.Error(w, `{"status":"nats disconnected"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !ready.Load() || !nc.IsConnected() {
			reason, _ := projErr.Load().(string)
			if reason == "" {
				reason = "projector catching up"
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(map[string]any{"status": "not ready", "reason": reason, "applied_seq": proj.Applied()})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "ready", "applied_seq": proj.Applied()})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/projects/", executor.RegistryHandler(l, executor.EchoDefinition, executor.SleepDefinition))
	mux.Handle("/v1/", projector.Handler(projector.NewQueries(store), projector.HTTPConfig{
		Verify: func(ctx context.Context) (ledger.VerifyReport, error) { return store.VerifyStream(ctx, js, l.StreamName()) },
	}))
	ln, err := net.Listen("tcp", f.httpListen)
	if err != nil {
		return fmt.Errorf("--http-listen %q: %w", f.httpListen, err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	log.Info("cgledger serving", "nats", url, "http", "http://"+ln.Addr().String(), "data", f.data,
		"stream", l.StreamName(), "bucket", l.BucketName(), "sync_always", f.syncAlways)

	<-ctx.Done()
	log.Info("shutting down")
	// Order: stop the HTTP server, then (deferred, in reverse) stop the
	// executor (stop pulling, drain in-flight calls), stop the API after its
	// in-flight requests, stop the projector and sync its checkpoint, close
	// the view store and the connection, and stop the embedded server last.
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = hs.Shutdown(shutCtx)
	return nil
}
