package main

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cgledger/cgledger/internal/diskspace"
	"github.com/cgledger/cgledger/internal/natsserver"
)

// superviseStorage restarts serve in place once storage that a failed write
// broke has room again: the embedded server's stream, which nats-server
// fails for good on "no space left" (or it disables JetStream), and the view
// store, which Pebble cannot write again after a failed write-ahead-log
// write. A restart reopens both, exactly as after a crash, which the ledger
// is built to survive (the stream is the truth; the views resume from their
// checkpoint). The process keeps its pid, arguments and environment (exec).
//
// fault is the ledger's last write refused by the server for want of
// storage. A later write clears it; one that lasts faultPatience with room
// on the disk means the server holds on to a refusal that free space does
// not lift, and a restart is what clears a server's state.
func superviseStorage(ctx context.Context, log *slog.Logger, dataDir string, guard *diskspace.Guard, srv *server.Server, sl *natsserver.StorageLog, fault func() error, storeBroken *atomic.Bool) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var faultSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		jsDown := (srv != nil && !srv.JetStreamEnabled()) || (sl != nil && sl.Failure() != "")
		viewsDown := storeBroken.Load()
		ferr := fault()
		switch {
		case ferr == nil:
			faultSince = time.Time{}
		case faultSince.IsZero():
			faultSince = time.Now()
		}
		stuck := ferr != nil && time.Since(faultSince) >= faultPatience
		if (!jsDown && !viewsDown && !stuck) || ctx.Err() != nil || !guard.Room() || writable(dataDir) != nil {
			continue
		}
		log.Warn("storage has room again after a failed write: restarting serve in place to reopen its stores",
			"jetstream_disabled", jsDown, "view_store_broken", viewsDown, "write_refused", ferr, "free_bytes", guard.Free())
		exe, err := os.Executable()
		if err == nil {
			err = syscall.Exec(exe, os.Args, os.Environ())
		}
		log.Error("restart in place failed: restart serve by hand", "err", err)
		return
	}
}

// faultPatience is how long a write refused for want of storage may stand,
// with room on the disk, before serve restarts in place: longer than the
// executor's first redeliveries, whose writes clear it when storage took
// them.
const faultPatience = 10 * time.Second

// writable returns why a file cannot be created in dir now, or nil (a file
// system remounted read-only has room but takes no writes: restarting then
// would only fail at start).
func writable(dir string) error {
	f, err := os.CreateTemp(dir, ".write-probe-*")
	if err != nil {
		return err
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
}
