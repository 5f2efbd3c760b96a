package projector

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cgledger/cgledger/internal/diskspace"
	"github.com/cgledger/cgledger/internal/lru"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Store is the projector's Pebble database holding every view.
type Store struct {
	db *pebble.DB
	// broken is set by Pebble's fatal log (quietLogger): from then on the
	// database is not touched by Sync or Close.
	broken *atomic.Bool

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
	// BeforeRebuild, when set, is called with what views of another format
	// hold before OpenStore empties them: an error leaves them as they are,
	// and OpenStore returns it. serve checks there that the ledger can give
	// back every entry they hold.
	BeforeRebuild func(FormatChange) error
	// BackgroundError, when set, is told of each failure of a write Pebble
	// makes on its own (a memtable flush, a compaction), except those that
	// met a corrupt file, which Corruption hears of; nil drops them.
	// Pebble retries a failed flush at once and for as long as it fails,
	// and OpenStore waits for the flush of the write-ahead log it replays:
	// on a disk without room for it, this is the only sign of the wait.
	BackgroundError func(error)
	// Corruption, when set, is told of each corruption Pebble finds while
	// reading (a block whose checksum does not match): the read that found
	// it fails with the same error. nil drops them. Without it Pebble's
	// default ends the process, which would leave a replica that restores
	// a damaged snapshot crashing on every start.
	Corruption func(error)
}

// OpenStore opens (creating if needed) the view database in dir. Views of
// another format are emptied, to be rebuilt by the projector's catch-up
// (Store.FormatChange).
func OpenStore(dir string, o StoreOptions) (*Store, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("projector: open store: %w", err)
	}
	broken := new(atomic.Bool)
	db, from, err := openDB(dir, o, broken)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, broken: broken, states: newStateCache(maxCachedStates), stories: newStoryCache(maxCachedStories)}
	if from != nil {
		// A store of format 1 was removed before this one was created.
		if err := s.resetTo(); err != nil {
			_ = db.Close()
			return nil, err
		}
		s.format = from
	} else if s.format, err = s.checkFormat(o.BeforeRebuild); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := s.openProjectIndex(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// openDB opens the Pebble database with the views' options. A database
// written with Pebble's default comparer (views format 1) cannot be opened
// with viewsComparer: its checkpoint is read, the directory removed and a
// new database created, and the change is returned.
func openDB(dir string, o StoreOptions, broken *atomic.Bool) (*pebble.DB, *FormatChange, error) {
	cacheSize := o.CacheBytes
	if cacheSize == 0 {
		cacheSize = 64 << 20
	}
	// Each open database takes its own reference to the cache.
	cache := pebble.NewCache(cacheSize)
	defer cache.Unref()
	db, err := pebble.Open(dir, dbOptions(o, cache, viewsComparer, broken))
	if err == nil {
		return db, nil, nil
	}
	if !isComparerMismatch(err) {
		return nil, nil, fmt.Errorf("projector: open view store %s: %w", dir, err)
	}
	old, oerr := pebble.Open(dir, dbOptions(o, cache, pebble.DefaultComparer, broken))
	if oerr != nil {
		return nil, nil, fmt.Errorf("projector: open view store %s of views format 1 (to rebuild it): %w", dir, oerr)
	}
	fc, _, err := (&Store{db: old, broken: broken}).pending()
	if fc == nil {
		fc = &FormatChange{} // an empty store of format 1
	}
	fc.From, fc.Reason = 1, reasonFormat(1)
	if err == nil && o.BeforeRebuild != nil {
		err = o.BeforeRebuild(*fc)
	}
	if err != nil {
		_ = old.Close()
		return nil, nil, err
	}
	if err := old.Close(); err != nil {
		return nil, nil, fmt.Errorf("projector: close view store %s of views format 1: %w", dir, err)
	}
	fs := o.FS
	if fs == nil {
		fs = vfs.Default
	}
	if err := fs.RemoveAll(dir); err != nil {
		return nil, nil, fmt.Errorf("projector: remove view store %s of views format 1: %w", dir, err)
	}
	if db, err = pebble.Open(dir, dbOptions(o, cache, viewsComparer, broken)); err != nil {
		return nil, nil, fmt.Errorf("projector: open view store %s: %w", dir, err)
	}
	return db, fc, nil
}

// isComparerMismatch reports whether Pebble refused to open a store
// written with another comparer.
func isComparerMismatch(err error) bool {
	return strings.Contains(err.Error(), "comparer name from file")
}

// dbOptions are the Pebble options of the view store.
func dbOptions(o StoreOptions, cache *pebble.Cache, cmp *pebble.Comparer, broken *atomic.Bool) *pebble.Options {
	// A larger memtable absorbs rebuild bursts with fewer flushes.
	opts := &pebble.Options{Logger: quietLogger{broken: broken}, Cache: cache, MemTableSize: 32 << 20, Comparer: cmp}
	// Point reads and group seeks (viewsComparer) dominate queries: bloom
	// filters let them skip sstables without reading blocks.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	if o.FS != nil {
		opts.FS = o.FS
	}
	opts.EventListener = &pebble.EventListener{BackgroundError: func(err error) {
		// Pebble tries a failed flush or compaction again at once, in a
		// loop that would take a core for as long as the disk is full, or
		// for ever on a corrupt file (which Corruption heard of already).
		if pebble.IsCorruptionError(err) {
			time.Sleep(backgroundRetryPause)
			return
		}
		if o.BackgroundError != nil {
			o.BackgroundError(err)
		}
		if diskspace.NoSpace(err) {
			time.Sleep(backgroundRetryPause)
		}
	}, DataCorruption: func(info pebble.DataCorruptionInfo) {
		// Called on the read path, which then returns the error itself.
		if o.Corruption != nil {
			o.Corruption(info.Details)
		}
	}}
	return opts
}

// backgroundRetryPause slows Pebble's retries of a background write that
// failed for want of disk space or on a corrupt file. It runs under
// Pebble's lock, which reads take too, so it stays short.
const backgroundRetryPause = 250 * time.Millisecond

// Close closes the store. It does not flush the memtable first: the
// write-ahead log holds it, and the next open replays it. A flush rotates
// the log, and Pebble answers a failed rotation (a full disk) with a panic
// from inside its commit pipeline that ends the process ("sync: unlock of
// unlocked mutex"), which nothing recovers. A store broken by a failed write
// is left as it is, for the same reason: Pebble gave up in the middle of a
// commit. Its files are as a crash leaves them, which the next open recovers
// from; Close then returns an error matching ErrStoreBroken.
func (s *Store) Close() (err error) {
	if s.broken.Load() {
		return fmt.Errorf("projector: view store left unclosed: %w", ErrStoreBroken)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("projector: close view store: %w", asStoreFatal(r))
		}
	}()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("projector: close view store: %w", err)
	}
	return nil
}

// Sync makes every committed batch durable (the projector commits without
// fsync: a crash can only roll the views back to an earlier consistent
// checkpoint, which the projector then re-applies from). On a broken store,
// or when this very write fails, it returns an error matching
// ErrStoreBroken.
func (s *Store) Sync() (err error) {
	if s.broken.Load() {
		return fmt.Errorf("projector: sync view store: %w", ErrStoreBroken)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("projector: sync view store: %w", asStoreFatal(r))
		}
	}()
	if err := s.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("projector: sync view store: %w", err)
	}
	return nil
}

// asStoreFatal returns the storeFatal a recovered panic carries, and panics
// again with anything else: only Pebble's fatal log is an error here.
func asStoreFatal(r any) storeFatal {
	sf, ok := r.(storeFatal)
	if !ok {
		panic(r)
	}
	return sf
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
type quietLogger struct {
	// broken is the store's: set before the fatal log panics.
	broken *atomic.Bool
}

// Infof drops Pebble's informational logs.
func (quietLogger) Infof(string, ...any) {}

// Errorf drops Pebble's error logs; failures surface as returned errors.
func (quietLogger) Errorf(string, ...any) {}

// Fatalf marks the store broken and panics, as Pebble expects of a fatal
// log, with a storeFatal that the projector's commit (and Sync, Close)
// turns into an error.
func (l quietLogger) Fatalf(format string, args ...any) {
	if l.broken != nil {
		l.broken.Store(true)
	}
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
