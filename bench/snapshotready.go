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

// snapshotShare is the part of the recorded entries the snapshot of
// --rebuild's "ready from a snapshot" row holds: a replica restoring it
// catches up the rest from the stream, as one restoring a snapshot taken
// on a schedule does.
const snapshotShare = 0.9

// snapshotSource takes, outside any timing, the snapshot a fresh replica
// restores: views of the first snapshotShare of entries, applied from
// memory under work, kept in a directory target under work.
func snapshotSource(ctx context.Context, entries []protocol.Entry, work string) (*snapshot.Dir, snapshot.Manifest, error) {
	n := int(float64(len(entries)) * snapshotShare)
	src, err := applyFloor(entries[:n], filepath.Join(work, "snapshot-source"))
	if err != nil {
		return nil, snapshot.Manifest{}, fmt.Errorf("views to snapshot: %w", err)
	}
	defer src.Close()
	t, err := snapshot.NewDir(filepath.Join(work, "snapshots"))
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
