// Package replay loads a ledger export into a fresh embedded JetStream
// server, projects it, and reports the view digest and chain head: the same
// file gives the same digest on any machine, every time.
package replay

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/stream"
)

// Result is what a replay produced.
type Result struct {
	// File is the export file's own chain verification.
	File stream.VerifyReport `json:"file"`
	// Entries is the number of entries loaded.
	Entries uint64 `json:"entries"`
	// AppliedSeq, Digest and ChainHead describe the projected views.
	AppliedSeq uint64 `json:"applied_seq"`
	Digest     string `json:"digest"`
	ChainHead  string `json:"chain_head"`
}

// Options configures a replay.
type Options struct {
	// Dir is the workspace (server store and views). Empty means a new
	// temporary directory, removed afterwards.
	Dir string
	// Inspect, when set, runs against the projected views before the
	// replay's server stops (tests read timelines and dumps with it).
	Inspect func(store *projector.Store, q *projector.Queries) error
	// Progress, when set, is called after each entry is imported and once
	// at the end: bytes of the file read of its size, entries imported, and
	// entries projected. It is called often; it should be cheap.
	Progress func(Progress)
}

// Progress is how far a replay has come.
type Progress struct {
	BytesRead, FileBytes int64
	Imported, Projected  uint64
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Run replays the export at path in one pass over the file: each entry is
// verified as it is read and imported with pipelined publishes, while the
// projector follows the stream and projects what is imported. A file that
// fails verification stops the import at the bad entry and is an error
// (the result's File says where).
func Run(ctx context.Context, path string, o Options) (*Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "cgledger-replay-"); err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		defer os.RemoveAll(dir)
	}
	srv, err := natsserver.Start(natsserver.Config{StoreDir: filepath.Join(dir, "jetstream"), ServerName: "cgledger-replay"})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect("nats://" + srv.Addr().String())
	if err != nil {
		return nil, fmt.Errorf("replay: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if err := stream.Provision(ctx, js, stream.Config{}); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	store, err := projector.OpenStore(filepath.Join(dir, "views"), projector.StoreOptions{})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer store.Close()
	p, err := projector.New(store, js, projector.Config{})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	// The projector follows the stream while the file is imported.
	pctx, stopProj := context.WithCancel(ctx)
	projDone := make(chan error, 1)
	go func() {
		err := p.CatchUp(pctx)
		if err == nil {
			err = p.Run(pctx)
		}
		projDone <- err
	}()
	stopProjector := func() error {
		stopProj()
		err := <-projDone
		if err != nil && pctx.Err() != nil && ctx.Err() == nil {
			err = nil // stopped by us
		}
		return err
	}
	cr := &countingReader{r: f}
	var imported atomic.Uint64
	report := func() {
		if o.Progress != nil {
			o.Progress(Progress{BytesRead: cr.n.Load(), FileBytes: st.Size(), Imported: imported.Load(), Projected: p.Applied()})
		}
	}
	rep, err := stream.ImportVerified(ctx, js, stream.DefaultName, cr, stream.ImportConfig{Progress: func(n uint64) {
		imported.Store(n)
		report()
	}})
	res := &Result{File: rep, Entries: imported.Load()}
	if err != nil {
		_ = stopProjector()
		return res, fmt.Errorf("replay: %w", err)
	}
	if !rep.OK {
		_ = stopProjector()
		return res, fmt.Errorf("replay: export file fails verification at seq %d: %s", rep.FirstBadSeq, rep.Reason)
	}
	// Wait until the projector has applied the last imported entry.
	for p.Applied() < rep.LastSeq {
		select {
		case err := <-projDone:
			projDone <- err
			return res, fmt.Errorf("replay: project: %w", err)
		case <-ctx.Done():
			_ = stopProjector()
			return res, fmt.Errorf("replay: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := stopProjector(); err != nil {
		return res, fmt.Errorf("replay: project: %w", err)
	}
	report()
	if err := store.Sync(); err != nil {
		return res, fmt.Errorf("replay: %w", err)
	}
	d, err := store.DigestNow()
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	res.AppliedSeq, res.Digest, res.ChainHead = d.AppliedSeq, d.Digest, d.ChainHead
	if res.ChainHead != rep.Head {
		return res, fmt.Errorf("replay: projected chain head %s differs from the file's %s", res.ChainHead, rep.Head)
	}
	if o.Inspect != nil {
		if err := o.Inspect(store, projector.NewQueries(store)); err != nil {
			return res, err
		}
	}
	return res, nil
}
