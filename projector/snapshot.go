package projector

import (
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// Checkpoint writes a consistent Pebble checkpoint of the views into dir
// (which must not exist) and returns the digest, applied sequence and chain
// head read back from the checkpoint itself, so the three describe exactly
// what dir holds even while the projector goes on applying (its batches
// commit the rows and the checkpoint row together, so any point-in-time
// copy is a consistent set of views). The memtable is flushed first, so the
// checkpoint is compressed sstables rather than a log to replay (a third
// of the bytes and of the restore time in BenchmarkRestoreAgainstRebuild),
// and the WAL synced so everything committed before the call is in it. A
// flush rotates the log as a full memtable does while applying: it adds no
// failure the projector does not already meet. The snapshot package packs
// dir into a views snapshot (docs/views.md#snapshots).
func (s *Store) Checkpoint(dir string) (res DigestResult, err error) {
	if s.broken.Load() {
		return res, fmt.Errorf("projector: checkpoint view store: %w", ErrStoreBroken)
	}
	if err := s.checkpointTo(dir); err != nil {
		return res, err
	}
	cp, err := OpenCheckpoint(dir)
	if err != nil {
		return res, err
	}
	defer cp.Close()
	return cp.DigestNow()
}

// checkpointTo runs Pebble's checkpoint, turning its fatal log (a failed
// WAL sync) into an error as Sync does.
func (s *Store) checkpointTo(dir string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("projector: checkpoint view store: %w", asStoreFatal(r))
		}
	}()
	if err := s.db.Flush(); err != nil {
		return fmt.Errorf("projector: checkpoint view store: flush: %w", err)
	}
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("projector: checkpoint view store to %s: %w", dir, err)
	}
	return nil
}

// OpenCheckpoint opens a checkpoint of the views (Store.Checkpoint, or one
// unpacked from a snapshot) read-only with the views' comparer: it is
// neither reformatted nor written, so its digest (DigestNow), format
// (Format) and links (LinkAt) are what the checkpoint holds. Only those
// reads and Close are meant for the returned Store.
func OpenCheckpoint(dir string) (*Store, error) {
	broken := new(atomic.Bool)
	cache := pebble.NewCache(8 << 20)
	defer cache.Unref()
	opts := dbOptions(StoreOptions{}, cache, viewsComparer, broken)
	opts.ReadOnly = true
	opts.ErrorIfNotExists = true
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("projector: open views checkpoint %s: %w", dir, err)
	}
	return &Store{db: db, broken: broken}, nil
}

// Format returns the views format recorded in the store (0 when it has
// none: a fresh store).
func (s *Store) Format() (int, error) {
	f, _, err := s.readFormat()
	return f, err
}
