package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/archive"
	"github.com/cgledger/cgledger/internal/backoff"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
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
	// A value that could not be read names where it came from; a value
	// read but invalid is named by where the value in force was set.
	unread := len(vs)
	if vs = append(vs, s.validate()...); len(vs) > 0 {
		for i, v := range vs {
			from := ""
			if src := source[v.Field]; i >= unread && src != "" && src != "default" {
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
// once it does. Its parts are components started in one order and stopped
// in the reverse (serveComponents).
func runServe(ctx context.Context, s Settings, log *slog.Logger, ready func(serving)) error {
	st := &serveState{s: s, log: log, ready: ready, embedded: s.NATSURL == "", url: s.NATSURL}
	return serveComponents(st).Run(ctx)
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
		// The reason first: /readyz reads a not-ready projector without
		// one as still catching up at start.
		reason.Store(err.Error())
		ready.Store(false)
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

// checkRebuild refuses to empty views of another format (fc) for a rebuild
// when the ledger cannot give back every entry they hold: the stream is
// missing, re-created or shorter than the views, or entries they applied
// were lost before they were archived. Nothing is changed then, and the
// error says what to do.
func checkRebuild(ctx context.Context, js jetstream.JetStream, data, views string, fc projector.FormatChange) error {
	if _, err := checkLedgerStream(ctx, js, stream.DefaultName, data, fc.Applied); err != nil {
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
	st, err := js.Stream(ctx, stream.DefaultName)
	if err != nil {
		return fmt.Errorf("read stream %s: %w", stream.DefaultName, err)
	}
	info, err := st.Info(ctx, jetstream.WithDeletedDetails(true))
	if err != nil {
		return fmt.Errorf("read stream %s: %w", stream.DefaultName, err)
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
func openHistory(js jetstream.JetStream, name, dir string, retention bool) (stream.History, *archive.Archive, error) {
	if !retention {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return stream.JetStreamHistory{JS: js, Stream: name}, nil, nil
		}
	}
	arch, err := archive.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	return archive.History{Archive: arch, JS: js, Stream: name}, arch, nil
}
