package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/diskspace"
	"github.com/cgledger/cgledger/internal/fsyncdir"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/snapshot"
	"github.com/cgledger/cgledger/stream"
)

// The paths a restore uses beside <data>/views. A restore moves the views
// it replaces to viewsAsideDir and removes them only once the snapshot is
// in place; the snapshot is unpacked under viewsRestoreTmp first, so a kill
// at any step leaves either the old views (put back at the next start) or
// a whole restored store.
const (
	viewsAsideDir   = "views.replaced"
	viewsRestoreTmp = "views.restoring"
)

// errRestoreFirst stops OpenStore before it empties views of another
// format: serve tries a snapshot of this release's format first.
type errRestoreFirst struct{ fc projector.FormatChange }

func (e errRestoreFirst) Error() string {
	return "views of another format: restore a snapshot before rebuilding (" + e.fc.Reason + ")"
}

// settleRestore finishes what a restore killed half-way left: views moved
// aside and no whole store in their place are put back; views moved aside
// with a restored store in place are removed; a partial unpack is removed.
func settleRestore(data string) error {
	views, aside := filepath.Join(data, "views"), filepath.Join(data, viewsAsideDir)
	if err := os.RemoveAll(filepath.Join(data, viewsRestoreTmp)); err != nil {
		return fmt.Errorf("remove the unpack of a restore that did not finish: %w", err)
	}
	if _, err := os.Stat(aside); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	empty, err := dirEmpty(views)
	if err != nil {
		return err
	}
	if !empty {
		// The rename that installs a restored store is atomic: a views
		// directory here is the whole snapshot.
		if err := os.RemoveAll(aside); err != nil {
			return fmt.Errorf("remove the views a restore replaced: %w", err)
		}
		return nil
	}
	if err := os.RemoveAll(views); err != nil {
		return fmt.Errorf("remove an empty views directory: %w", err)
	}
	if err := os.Rename(aside, views); err != nil {
		return fmt.Errorf("put back the views a restore that did not finish moved aside: %w", err)
	}
	return fsyncdir.Sync(data)
}

// dirEmpty reports whether dir is missing or holds nothing; a directory
// that cannot be read is an error, never taken for empty.
func dirEmpty(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("read %s: %w", dir, err)
	}
	return len(entries) == 0, nil
}

// errNoSnapshotTarget says the Object Store bucket of snapshots does not
// exist: nothing to restore, and a restore creates nothing.
var errNoSnapshotTarget = errors.New("no snapshot bucket")

// snapshotTarget opens where snapshots are kept: views_snapshot_dir, else
// the Object Store bucket of the ledger stream, created when create is set
// (the snapshotter) and errNoSnapshotTarget when missing otherwise (a
// restore).
func (st *serveState) snapshotTarget(ctx context.Context, create bool) (snapshot.Target, error) {
	if dir := st.s.ViewsSnapshotDir; dir != "" {
		if !create {
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
				return nil, errNoSnapshotTarget
			}
		}
		return snapshot.NewDir(dir)
	}
	bucket := snapshot.BucketName(stream.DefaultName)
	if !create {
		if _, err := st.js.ObjectStore(ctx, bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, errNoSnapshotTarget
		} else if err != nil {
			return nil, fmt.Errorf("snapshot bucket %s: %w", bucket, err)
		}
	}
	return snapshot.NewObjectStore(ctx, st.js, bucket, st.s.Replicas)
}

// restoreViews installs the newest snapshot that passes every check as the
// views (docs/views.md#snapshots). Views there already (of another format)
// are moved aside and removed only once the snapshot is in place; when no
// snapshot passes they are put back and the caller goes on as without
// snapshots. It reports whether it restored; its errors are the ones that
// leave the data directory in a state serve cannot go on from.
func (st *serveState) restoreViews(ctx context.Context, why string) (bool, error) {
	data, log := st.s.Data, st.log
	views, aside := filepath.Join(data, "views"), filepath.Join(data, viewsAsideDir)
	// HTTP answers while this runs: /readyz names the step.
	st.startStep.Store(restoringStep)
	defer st.startStep.Store(startingStep)
	var target snapshot.Target
	if err := untilClusterAnswers(ctx, log, "open the views snapshots", func() (err error) {
		target, err = st.snapshotTarget(ctx, false)
		return err
	}); errors.Is(err, errNoSnapshotTarget) {
		log.Info("views: no snapshot to restore: rebuilding them from the ledger", "why", why)
		return false, nil
	} else if err != nil {
		log.Warn("views: cannot read the snapshots: rebuilding the views from the ledger", "why", why, "err", err)
		return false, nil
	}
	empty, err := dirEmpty(views)
	if err != nil {
		return false, err
	}
	moved := !empty
	if moved {
		if err := os.Rename(views, aside); err != nil {
			return false, fmt.Errorf("move the views aside to restore a snapshot: %w", err)
		}
	} else if err := os.RemoveAll(views); err != nil {
		return false, fmt.Errorf("remove the empty views directory to restore a snapshot: %w", err)
	}
	if err := fsyncdir.Sync(data); err != nil {
		return false, err
	}
	log.Info("views: restoring the newest snapshot that passes its checks", "why", why, "from", target.String())
	start := time.Now()
	tmp := filepath.Join(data, viewsRestoreTmp)
	var m snapshot.Manifest
	// A cluster electing a leader is waited for, as every start-up step
	// that talks to JetStream: a fresh replica started then restores
	// instead of rebuilding from sequence 1.
	for {
		err = untilClusterAnswers(ctx, log, "restore the views from a snapshot", func() (err error) {
			m, err = snapshot.Restore(ctx, target, views, snapshot.RestoreOptions{
				Stream: stream.DefaultName, JS: st.js, Log: log, TempDir: tmp,
			})
			return err
		})
		if rerr := os.RemoveAll(tmp); rerr != nil {
			log.Warn("views: remove the directory snapshots were unpacked in", "dir", tmp, "err", rerr)
		}
		// A rebuild needs as much room as the snapshot, and would fill
		// the same disk hours later: wait for space instead.
		if !diskspace.NoSpace(err) || ctx.Err() != nil {
			break
		}
		if werr := waitForRoom(ctx, log, data, err); werr != nil {
			err = werr
			break
		}
	}
	if ctx.Err() != nil {
		// Stopped (a signal) while restoring: the next start settles
		// what is left and tries again.
		return false, ctx.Err()
	}
	if err == nil {
		log.Info("views restored from a snapshot: catching up from its sequence", "snapshot", m.Name, "applied_seq", m.AppliedSeq,
			"digest", m.Digest, "created", m.Created, "host", m.Host, "size", m.Size, "duration", time.Since(start).Round(time.Millisecond))
		if err := os.RemoveAll(aside); err != nil {
			return true, fmt.Errorf("remove the views the snapshot replaced: %w", err)
		}
		return true, fsyncdir.Sync(data)
	}
	var refused *snapshot.RefusedError
	switch {
	case errors.Is(err, snapshot.ErrNoSnapshot) || errors.As(err, &refused):
		log.Warn("views: no snapshot passes its checks: rebuilding the views from the ledger", "why", why, "err", err)
	default:
		log.Warn("views: restore failed: rebuilding the views from the ledger", "why", why, "err", err)
	}
	if err := os.RemoveAll(views); err != nil {
		return false, fmt.Errorf("remove a restore that failed: %w", err)
	}
	if moved {
		if err := os.Rename(aside, views); err != nil {
			return false, fmt.Errorf("put back the views moved aside for a restore: %w", err)
		}
	}
	return false, fsyncdir.Sync(data)
}

// restoreRoomPoll is how often a restore waiting for disk space looks again.
const restoreRoomPoll = 2 * time.Second

// waitForRoom waits until the file system of dir has more free space than
// after the restore that failed for want of it (err), or ctx ends. Any
// space that comes back is worth another try: the restore removed its
// partial unpack, so what it needs is its own size and no more.
func waitForRoom(ctx context.Context, log *slog.Logger, dir string, err error) error {
	// A file system that cannot be measured is looked at again below.
	base, _, _ := diskspace.Space(dir)
	log.Warn("views: no room on the disk to unpack a snapshot: waiting for free space, then restoring again (a rebuild would need as much room)",
		"dir", dir, "free_bytes", base, "err", err)
	t := time.NewTicker(restoreRoomPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if free, _, serr := diskspace.Space(dir); serr == nil && free > base+restoreRoomStep {
			log.Info("views: free space came back: restoring again", "dir", dir, "free_bytes", free)
			return nil
		}
	}
}

// restoreRoomStep is how much free space must come back before a restore
// is tried again: more than the file system's own churn.
const restoreRoomStep = 1 << 20
