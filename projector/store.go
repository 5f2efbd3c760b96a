package projector

import (
	"errors"
	"fmt"
	"github.com/cgledger/cgledger/internal/lru"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Store is the projector's Pebble database holding every view.
type Store struct {
	db *pebble.DB

	// states caches committed call states for the applier (statecache.go).
	// The projector is the only writer, so the cache cannot go stale.
	states *lru.Cache[*CallState]
	// stories are cs rows known to be committed (storycache.go).
	stories *lru.Cache[struct{}]

	// projects is the set of projects in the project index (projects.go).
	projects projectSet

	// format is what OpenStore did about the store's views format.
	format *FormatChange
}

// FormatChange is non-nil when OpenStore found the views in another format
// (or in one an older release wrote to) and emptied them: the projector's
// catch-up rebuilds them from sequence 1.
func (s *Store) FormatChange() *FormatChange { return s.format }

func (s *Store) cachedState(k string) (*CallState, bool) { return s.states.Get(k) }

func (s *Store) cacheState(k string, st *CallState) { s.states.Put(k, st) }

func (s *Store) cacheStates(m map[string]*CallState) { s.states.PutAll(m) }

func (s *Store) dropCache() {
	s.states.Clear()
	s.stories.Clear()
}

// StoreOptions configures OpenStore. The zero value uses the OS filesystem.
type StoreOptions struct {
	// FS replaces the filesystem (tests use Pebble's crash-simulating
	// in-memory filesystem). Nil means the OS filesystem.
	FS vfs.FS
	// CacheBytes sizes Pebble's block cache. Zero means 64 MiB.
	CacheBytes int64
}

// OpenStore opens (creating if needed) the view database in dir.
func OpenStore(dir string, o StoreOptions) (*Store, error) {
	cacheSize := o.CacheBytes
	if cacheSize == 0 {
		cacheSize = 64 << 20
	}
	cache := pebble.NewCache(cacheSize)
	defer cache.Unref()
	// A larger memtable absorbs rebuild bursts with fewer flushes.
	opts := &pebble.Options{Logger: quietLogger{}, Cache: cache, MemTableSize: 32 << 20}
	// Point reads (entries, cards, call states) dominate queries: bloom
	// filters let them skip sstables without reading blocks.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	if o.FS != nil {
		opts.FS = o.FS
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("projector: open view store %s: %w", dir, err)
	}
	s := &Store{db: db, states: newStateCache(maxCachedStates), stories: newStoryCache(maxCachedStories)}
	if s.format, err = s.checkFormat(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := s.openProjectIndex(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// Close flushes and closes the store.
func (s *Store) Close() error {
	if err := s.db.Flush(); err != nil {
		_ = s.db.Close()
		return fmt.Errorf("projector: flush view store: %w", err)
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("projector: close view store: %w", err)
	}
	return nil
}

// Sync makes every committed batch durable (the projector commits without
// fsync: a crash can only roll the views back to an earlier consistent
// checkpoint, which the projector then re-applies from).
func (s *Store) Sync() error {
	if err := s.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("projector: sync view store: %w", err)
	}
	return nil
}

// checkpoint reads the applied checkpoint; a fresh store is at sequence 0.
func (s *Store) checkpoint() (checkpoint, error) {
	v, closer, err := s.db.Get(metaApplied)
	if errors.Is(err, pebble.ErrNotFound) {
		return checkpoint{}, nil
	}
	if err != nil {
		return checkpoint{}, fmt.Errorf("projector: read checkpoint: %w", err)
	}
	defer closer.Close()
	return decodeCheckpoint(v)
}

// Applied is the last ledger sequence applied to the views.
func (s *Store) Applied() (uint64, error) {
	cp, err := s.checkpoint()
	return cp.Applied, err
}

// Reset deletes every view (for a rebuild from sequence 1).
func (s *Store) Reset() error { return s.resetTo() }

// quietLogger keeps Pebble's informational logs out of the service's output.
type quietLogger struct{}

// Infof drops Pebble's informational logs.
func (quietLogger) Infof(string, ...any) {}

// Errorf drops Pebble's error logs; failures surface as returned errors.
func (quietLogger) Errorf(string, ...any) {}

// Fatalf panics, as Pebble expects of a fatal log, with a storeFatal that
// the projector's commit turns into an error.
func (quietLogger) Fatalf(format string, args ...any) {
	panic(storeFatal{fmt.Errorf(format, args...)})
}

// ErrStoreBroken matches the error of a view-store write that Pebble could
// not complete (a failed WAL write: full or read-only disk). The store does
// not take writes again until it is reopened (serve restarts itself).
var ErrStoreBroken = errors.New("view store broken by a failed write; serve restarts itself in place once the disk has room")

// storeFatal is a fatal Pebble error, carried by a panic.
type storeFatal struct{ err error }

func (f storeFatal) Error() string { return ErrStoreBroken.Error() + ": " + f.err.Error() }
func (f storeFatal) Unwrap() error { return ErrStoreBroken }
