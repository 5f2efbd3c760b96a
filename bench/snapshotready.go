package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/snapshot"
	"github.com/cgledger/cgledger/stream"
)

// snapshotShares are the parts of the recorded entries the snapshots of
// --rebuild's "ready" rows hold: all of them (the restore alone: checks,
// open), and nine tenths, which a replica restoring it catches up from the
// stream, as one restoring a snapshot taken on a schedule does.
var snapshotShares = []float64{1, 0.9}

// snapshotSource takes, outside any timing, the snapshot a fresh replica
// restores: views of the first share of entries, applied from memory under
// work, kept in a directory target of its own under work.
func snapshotSource(ctx context.Context, entries []protocol.Entry, share float64, work string) (*snapshot.Dir, snapshot.Manifest, error) {
	n := int(float64(len(entries)) * share)
	name := fmt.Sprintf("snapshot-%d", n)
	src, err := applyFloor(entries[:n], filepath.Join(work, name+"-source"))
	if err != nil {
		return nil, snapshot.Manifest{}, fmt.Errorf("views to snapshot: %w", err)
	}
	defer src.Close()
	t, err := snapshot.NewDir(filepath.Join(work, name))
	if err != nil {
		return nil, snapshot.Manifest{}, err
	}
	m, err := snapshot.Take(ctx, src, t, snapshot.TakeOptions{Stream: stream.DefaultName, TempDir: work})
	if err != nil {
		return nil, snapshot.Manifest{}, fmt.Errorf("take snapshot: %w", err)
	}
	return t, m, nil
}

// readyFromSnapshot is what a fresh replica does before it is ready with
// views restore enabled: restore the newest snapshot that passes every
// check (digest recomputed, chain checked against the stream) into dir,
// open it and catch up from its sequence to the stream's end. It returns
// the store, open, for its digest.
func readyFromSnapshot(ctx context.Context, js jetstream.JetStream, t snapshot.Target, dir string) (*projector.Store, error) {
	views := filepath.Join(dir, "views")
	if _, err := snapshot.Restore(ctx, t, views, snapshot.RestoreOptions{Stream: stream.DefaultName, JS: js, TempDir: dir,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	return rebuildViews(ctx, js, views)
}
