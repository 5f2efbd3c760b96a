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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/projector"
)

// Result is what a replay produced.
type Result struct {
	// File is the export file's own chain verification.
	File ledger.VerifyReport `json:"file"`
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
}

// Run replays the export at path.
func Run(ctx context.Context, path string, o Options) (*Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer f.Close()
	rep, err := ledger.VerifyExport(f)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	res := &Result{File: rep}
	if !rep.OK {
		return res, fmt.Errorf("replay: export file fails verification at seq %d: %s", rep.FirstBadSeq, rep.Reason)
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
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if err := ledger.Provision(ctx, js, ledger.StreamConfig{}); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	tr, err := ledger.Import(ctx, js, ledger.DefaultStream, f)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	res.Entries = tr.Count
	store, err := projector.OpenStore(filepath.Join(dir, "views"), projector.StoreOptions{})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer store.Close()
	p, err := projector.New(store, js, projector.Config{})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	if err := p.CatchUp(ctx); err != nil {
		return nil, fmt.Errorf("replay: project: %w", err)
	}
	d, err := store.DigestNow()
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	res.AppliedSeq, res.Digest, res.ChainHead = d.AppliedSeq, d.Digest, d.ChainHead
	if res.ChainHead != tr.Head {
		return res, fmt.Errorf("replay: projected chain head %s differs from the file's %s", res.ChainHead, tr.Head)
	}
	if o.Inspect != nil {
		if err := o.Inspect(store, projector.NewQueries(store)); err != nil {
			return res, err
		}
	}
	return res, nil
}
