package projector

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/cockroachdb/pebble/v2"
)

// ViewsFormat is the version of the views' row layout (docs/views.md#format).
// A store of another version, or one without a version (written before
// versions existed), is emptied when it is opened and rebuilt from the
// ledger by the projector's catch-up: the views are derived, the stream
// and the archive are the truth.
const ViewsFormat = 4

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
	// Reason says why the views are rebuilt, for people.
	Reason string
	// Lost are the ranges the views recorded as lost and stepped over: a
	// rebuild loses nothing there.
	Lost [][2]uint64
}

// lostRanges reads the views' lost rows.
func lostRanges(r reader) ([][2]uint64, error) {
	var out [][2]uint64
	err := scan(r, key(tagLost).prefix(), nil, func(k, v []byte) (bool, error) {
		if len(v) == 8 {
			out = append(out, [2]uint64{trailingU64(k), binary.BigEndian.Uint64(v)})
		}
		return true, nil
	})
	return out, err
}

// pending says what the store needs to become of ViewsFormat, changing
// nothing: a FormatChange when it holds views of another format; stamp
// when it only lacks the format row (it is empty).
func (s *Store) pending() (fc *FormatChange, stamp bool, err error) {
	from, stale, err := s.readFormat()
	if err != nil || (from == ViewsFormat && !stale) {
		return nil, false, err
	}
	if empty, err := s.empty(); err != nil || empty {
		return nil, empty, err
	}
	// A checkpoint in a format this release does not know may not decode;
	// it is only a hint.
	cp, _ := s.checkpoint()
	lost, err := lostRanges(s.db)
	if err != nil {
		return nil, false, fmt.Errorf("projector: views format: %w", err)
	}
	return &FormatChange{From: from, Applied: cp.Applied, Reason: reason(from, stale), Lost: lost}, false, nil
}

func reasonFormat(from int) string {
	if from == 0 {
		return "the views were written before views formats were numbered"
	}
	return fmt.Sprintf("the views are of format %d", from)
}

func reason(from int, stale bool) string {
	if from == ViewsFormat && stale {
		return "a release of views format 1 has written to these views since"
	}
	return reasonFormat(from)
}

// readFormat reads the store's format row (0 when absent) and whether format 1's
// project marker is in it.
func (s *Store) readFormat() (from int, stale bool, err error) {
	raw, ok, err := get(s.db, metaFormat)
	if err != nil {
		return 0, false, fmt.Errorf("projector: read views format: %w", err)
	}
	if ok {
		if from, err = strconv.Atoi(string(raw)); err != nil {
			return 0, false, fmt.Errorf("projector: views format row %q: %w", raw, err)
		}
	}
	if _, stale, err = get(s.db, metaProjects); err != nil {
		return 0, false, fmt.Errorf("projector: read views format: %w", err)
	}
	return from, stale, nil
}

// checkFormat makes the store's rows of ViewsFormat: a fresh store is
// stamped, a store of another format is emptied and stamped (the caller's
// catch-up rebuilds it) once before, if set, agrees. It returns the change
// made, if any.
func (s *Store) checkFormat(before func(FormatChange) error) (*FormatChange, error) {
	fc, stamp, err := s.pending()
	if err != nil || (fc == nil && !stamp) {
		return nil, err
	}
	if fc != nil && before != nil {
		if err := before(*fc); err != nil {
			return nil, err
		}
	}
	return fc, s.resetTo()
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
