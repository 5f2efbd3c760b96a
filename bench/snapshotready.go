package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/snapshot"
	"github.com/cgledger/cgledger/stream"
)

// snapshotShares are the parts of the recorded entries the snapshots of
// --rebuild's "ready" rows hold: all of them (the restore alone: checks,
// open), and nine tenths, which a replica restoring it catches up from the
// stream, as one restoring a snapshot taken on a schedule does.
var snapshotShares = []float64{1, 0.9}

// snapshotSources takes, outside any timing, the snapshots a fresh replica
// restores, one per share of snapshotShares (in its order): views of that
// share of the entries, applied from memory under work in one pass (each
// snapshot taken when the pass reaches its share), each kept in a
// directory target of its own under work. It returns the targets and the
// sequence each snapshot is at.
func snapshotSources(ctx context.Context, entries *heldEntries, work string) ([]*snapshot.Dir, []uint64, error) {
	order := make([]int, len(snapshotShares))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(snapshotShares[a], snapshotShares[b]) })
	src, err := projector.OpenStore(filepath.Join(work, "snapshot-source"), projector.StoreOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("views to snapshot: %w", err)
	}
	defer src.Close()
	targets := make([]*snapshot.Dir, len(snapshotShares))
	seqs := make([]uint64, len(snapshotShares))
	applied := 0
	for _, i := range order {
		n := int(float64(entries.len()) * snapshotShares[i])
		if err := applyHeld(src, entries, applied, n); err != nil {
			return nil, nil, fmt.Errorf("views to snapshot: %w", err)
		}
		applied = n
		t, err := snapshot.NewDir(filepath.Join(work, fmt.Sprintf("snapshot-%d", n)))
		if err != nil {
			return nil, nil, err
		}
		m, err := snapshot.Take(ctx, src, t, snapshot.TakeOptions{Stream: stream.DefaultName, TempDir: work})
		if err != nil {
			return nil, nil, fmt.Errorf("take snapshot: %w", err)
		}
		targets[i], seqs[i] = t, m.AppliedSeq
	}
	return targets, seqs, nil
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
