package projector

import (
	"fmt"
	"strconv"

	"github.com/cockroachdb/pebble/v2"
)

// ViewsFormat is the version of the views' row layout (docs/views.md#format).
// A store of another version, or one without a version (written before
// versions existed), is emptied when it is opened and rebuilt from the
// ledger by the projector's catch-up: the views are derived, the stream
// and the archive are the truth.
const ViewsFormat = 2

// metaFormat holds the store's ViewsFormat as decimal text.
var metaFormat = key(tagMeta, "format")

// metaProjects was the project index's marker in format 1, which wrote it
// with every batch. Format 2 never writes it, so its presence in a store of
// format 2 means that a release of format 1 has applied entries to it since
// (a downgrade and upgrade): its rows are mixed, and it is rebuilt.
var metaProjects = key(tagMeta, "projects")

// FormatChange says what OpenStore found: the format a store had (0 for
// none) when it was emptied to be rebuilt in ViewsFormat.
type FormatChange struct {
	// From is the format the store had: 0 when it had none (written before
	// formats were versioned); ViewsFormat when a release of an older format
	// wrote to it since.
	From int
	// Applied is the sequence the emptied views had applied (0 when their
	// checkpoint could not be read), for the checks a start makes against
	// the stream.
	Applied uint64
}

// checkFormat makes the store's rows of ViewsFormat: a fresh store is
// stamped, a store of another format is emptied and stamped (the caller's
// catch-up rebuilds it). It returns the change made, if any.
func (s *Store) checkFormat() (*FormatChange, error) {
	raw, ok, err := get(s.db, metaFormat)
	if err != nil {
		return nil, fmt.Errorf("projector: read views format: %w", err)
	}
	from := 0
	if ok {
		if from, err = strconv.Atoi(string(raw)); err != nil {
			return nil, fmt.Errorf("projector: views format row %q: %w", raw, err)
		}
	}
	_, stale, err := get(s.db, metaProjects)
	if err != nil {
		return nil, fmt.Errorf("projector: read views format: %w", err)
	}
	if from == ViewsFormat && !stale {
		return nil, nil
	}
	empty, err := s.empty()
	if err != nil {
		return nil, err
	}
	// A checkpoint in a format this release does not know may not decode;
	// it is only a hint.
	cp, _ := s.checkpoint()
	if err := s.resetTo(); err != nil {
		return nil, err
	}
	if empty {
		return nil, nil
	}
	return &FormatChange{From: from, Applied: cp.Applied}, nil
}

// empty reports whether the store holds no row at all.
func (s *Store) empty() (bool, error) {
	it, err := s.db.NewIter(nil)
	if err != nil {
		return false, fmt.Errorf("projector: views format: %w", err)
	}
	defer it.Close()
	if it.First() {
		return false, nil
	}
	return true, it.Error()
}

// resetTo deletes every row and stamps the store with ViewsFormat, in one
// synced batch.
func (s *Store) resetTo() (err error) {
	defer func() {
		// A failed WAL write is a fatal Pebble log, which panics (store.go).
		if r := recover(); r != nil {
			sf, ok := r.(storeFatal)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("projector: reset views: %w", sf)
		}
	}()
	s.dropCache()
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.DeleteRange([]byte{0}, []byte{0xff, 0xff, 0xff, 0xff}, nil); err != nil {
		return fmt.Errorf("projector: reset views: %w", err)
	}
	if err := b.Set(metaFormat, []byte(strconv.Itoa(ViewsFormat)), nil); err != nil {
		return fmt.Errorf("projector: reset views: %w", err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("projector: reset views: %w", err)
	}
	return nil
}
