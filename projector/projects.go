package projector

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cgledger/cgledger/ledger"
)

// The project index: one proj\0<project> row per project, holding the
// sequence and time of the project's first entry (the first entry that
// wrote a project-scoped row, projectRowTags). The applier writes a row the
// first time a project appears; stores written before the index existed
// are backfilled from their rows when opened (docs/audit-api.md#project-index).

// ProjectInfo is one project in the project index.
type ProjectInfo struct {
	ProjectID string `json:"project_id"`
	// FirstSeq and FirstTime are the project's first entry's sequence and
	// time (the zero time when that entry has none).
	FirstSeq  uint64    `json:"first_seq"`
	FirstTime time.Time `json:"first_time"`
}

// projectSet is the set of projects the store's committed proj rows name,
// so that the applier does not read Pebble to know whether a project is new.
type projectSet struct {
	mu    sync.Mutex
	known map[string]struct{}
}

func (p *projectSet) has(name []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.known[string(name)]
	return ok
}

func (p *projectSet) add(names map[string]struct{}) {
	if len(names) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known == nil {
		p.known = map[string]struct{}{}
	}
	for n := range names {
		p.known[n] = struct{}{}
	}
}

func (p *projectSet) reset() {
	p.mu.Lock()
	p.known = nil
	p.mu.Unlock()
}

func encodeProjectRow(seq uint64, t time.Time) []byte {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(make([]byte, 0, 16), seq), uint64(ns))
}

func decodeProjectRow(project string, v []byte) (ProjectInfo, error) {
	if len(v) != 16 {
		return ProjectInfo{}, fmt.Errorf("projector: project row %s has %d bytes", project, len(v))
	}
	p := ProjectInfo{ProjectID: project, FirstSeq: binary.BigEndian.Uint64(v)}
	if ns := int64(binary.BigEndian.Uint64(v[8:])); ns != 0 {
		p.FirstTime = time.Unix(0, ns).UTC()
	}
	return p, nil
}

// openProjectIndex makes the project index complete (backfilling it when
// the marker is missing or behind the checkpoint) and loads the set of
// known projects. OpenStore calls it.
func (s *Store) openProjectIndex() error {
	cp, err := s.checkpoint()
	if err != nil {
		return err
	}
	if cp.Applied > 0 {
		marker, ok, err := get(s.db, metaProjects)
		if err != nil {
			return fmt.Errorf("projector: read project index marker: %w", err)
		}
		if !ok || len(marker) != 8 || binary.BigEndian.Uint64(marker) != cp.Applied {
			if err := s.backfillProjects(cp); err != nil {
				return err
			}
		}
	}
	known := map[string]struct{}{}
	p := key(tagProject).prefix()
	err = scan(s.db, p, nil, func(k, _ []byte) (bool, error) {
		known[string(k[len(p):])] = struct{}{}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("projector: load project index: %w", err)
	}
	s.projects.reset()
	s.projects.add(known)
	return nil
}

// firstSeqs computes every project's first sequence from the
// project-scoped rows, as the applier defines it.
func firstSeqs(r reader) (map[string]uint64, error) {
	first := map[string]uint64{}
	for _, tag := range projectRowTags {
		p := key(tag).prefix()
		err := scan(r, p, nil, func(k, _ []byte) (bool, error) {
			rest := k[len(p):]
			j := bytes.IndexByte(rest, 0)
			if j < 0 || len(k) < len(p)+j+1+8 {
				return false, fmt.Errorf("malformed %s row %q", tag, k)
			}
			project := string(rest[:j])
			if !ledger.ValidIdentifier(project) {
				return true, nil
			}
			seq := trailingU64(k)
			if cur, ok := first[project]; !ok || seq < cur {
				first[project] = seq
			}
			return true, nil
		})
		if err != nil {
			return nil, err
		}
	}
	return first, nil
}

// backfillProjects rebuilds the project index from the store's rows and
// writes it with the marker in one batch: exactly the rows the applier
// would have written had the index existed from sequence 1.
func (s *Store) backfillProjects(cp checkpoint) (err error) {
	defer func() {
		// A failed WAL write is a fatal Pebble log, which panics (store.go).
		if r := recover(); r != nil {
			sf, ok := r.(storeFatal)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("projector: backfill project index: %w", sf)
		}
	}()
	snap := s.db.NewSnapshot()
	defer snap.Close()
	first, err := firstSeqs(snap)
	if err != nil {
		return fmt.Errorf("projector: backfill project index: %w", err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	p := key(tagProject).prefix()
	if err := b.DeleteRange(p, upperBound(p), nil); err != nil {
		return fmt.Errorf("projector: backfill project index: %w", err)
	}
	for project, seq := range first {
		raw, ok, err := get(snap, key(tagEntry).u64(seq))
		if err != nil || !ok {
			return fmt.Errorf("projector: backfill project index: entry %d of project %s not stored: %v", seq, project, err)
		}
		se, err := decodeEntry(raw)
		if err != nil {
			return fmt.Errorf("projector: backfill project index: decode entry %d: %w", seq, err)
		}
		if err := b.Set(key(tagProject, project), encodeProjectRow(seq, se.Time), nil); err != nil {
			return fmt.Errorf("projector: backfill project index: %w", err)
		}
	}
	if err := b.Set(metaProjects, binary.BigEndian.AppendUint64(nil, cp.Applied), nil); err != nil {
		return fmt.Errorf("projector: backfill project index: %w", err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("projector: backfill project index: %w", err)
	}
	return nil
}

// Projects lists the projects the views hold as of the query, by project
// id: a project is listed as of sequence S when its first entry's sequence
// is at or before S.
func (q *Queries) Projects(at AsOf, cursor string, limit int) (*Page[ProjectInfo], error) {
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	limit = clampLimit(limit)
	p := key(tagProject).prefix()
	lower, err := decodeCursor(cursor, p)
	if err != nil {
		return nil, err
	}
	out := &Page[ProjectInfo]{AsOfSeq: v.seq, Items: []ProjectInfo{}}
	err = scan(v.snap, p, lower, func(k, val []byte) (bool, error) {
		info, err := decodeProjectRow(string(k[len(p):]), val)
		if err != nil || info.FirstSeq > v.seq {
			return err == nil, err
		}
		if len(out.Items) == limit {
			out.NextCursor = encodeCursor(key(tagProject, out.Items[len(out.Items)-1].ProjectID))
			return false, nil
		}
		out.Items = append(out.Items, info)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: projects: %w", err)
	}
	return out, nil
}
