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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
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
	// entries projected. It is called often (during the import from the
	// goroutine that publishes, never two calls at once); it should be
	// cheap.
	Progress func(Progress)
}

// Progress is how far a replay has come.
type Progress struct {
	BytesRead, FileBytes int64
	Imported, Projected  uint64
}

// applyChunk entries go to the applier at a time, and at most applyQueue
// chunks wait for it: the import runs at most that far ahead of the views
// (16k entries, some 16 MB of a ledger's): room enough that a pause on one
// side (a Pebble commit, the server's writes) does not stop the other, as
// in the floor, where each side has every entry from the start.
const (
	applyChunk = 256
	applyQueue = 64
)

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
// verified as it is read, imported with pipelined publishes, and projected
// on another goroutine from the entry as decoded (not read back from the
// stream); an entry the views cannot take (a corrupt one) is left to a
// projector catching up from the stream, which finds its skip entry as
// serve's does. A file that
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
	// The file is decoded once: each verified entry is projected from
	// there, on another goroutine, while the import stores it (a
	// projector following the stream would read every entry back).
	x, err := projector.NewEntryApplier(store, projector.DefaultBatchSize)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	chunks := make(chan []protocol.Entry, applyQueue)
	applied := make(chan error, 1)
	go func() {
		var err error
		for c := range chunks {
			if err == nil {
				err = x.Apply(c...)
			}
		}
		if cerr := x.Close(); err == nil {
			err = cerr
		}
		applied <- err
	}()
	var chunk []protocol.Entry
	endApply := func() error {
		if len(chunk) > 0 {
			chunks <- chunk
			chunk = nil
		}
		close(chunks)
		err := <-applied
		if projector.Fatal(err) {
			// A gap or a corrupt entry: the store stops just before it,
			// and the projector below takes it from there as it does
			// from the stream (a skip entry later in the file is found).
			err = nil
		}
		return err
	}
	var projected func() uint64 = x.Applied
	cr := &countingReader{r: f}
	var imported atomic.Uint64
	report := func() {
		if o.Progress != nil {
			o.Progress(Progress{BytesRead: cr.n.Load(), FileBytes: st.Size(), Imported: imported.Load(), Projected: projected()})
		}
	}
	rep, err := stream.ImportVerified(ctx, js, stream.DefaultName, cr, stream.ImportConfig{
		Progress: func(n uint64) {
			imported.Store(n)
			report()
		},
		Verified: func(e stream.ExportEntry) error {
			chunk = append(chunk, e.Entry)
			if len(chunk) == applyChunk {
				select {
				case chunks <- chunk:
				case <-ctx.Done():
					return ctx.Err()
				}
				chunk = make([]protocol.Entry, 0, applyChunk)
			}
			return nil
		},
	})
	res := &Result{File: rep, Entries: imported.Load()}
	aerr := endApply()
	if err != nil {
		return res, fmt.Errorf("replay: %w", err)
	}
	if !rep.OK {
		return res, fmt.Errorf("replay: export file fails verification at seq %d: %s", rep.FirstBadSeq, rep.Reason)
	}
	if aerr != nil {
		return res, fmt.Errorf("replay: project: %w", aerr)
	}
	// What the applier did not project (it stopped on an entry it could
	// not apply) the projector takes from the stream, with its skip
	// entries; otherwise it has nothing to do.
	p, err := projector.New(store, js, projector.Config{})
	if err != nil {
		return res, fmt.Errorf("replay: %w", err)
	}
	projected = p.Applied
	if err := p.CatchUp(ctx); err != nil {
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
