package projector

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"
)

// The project index: one proj\0<project> row per project, holding the
// sequence and time of the project's first entry (the first entry that
// wrote a project-scoped row, projectRowTags). The applier writes a row the
// first time a project appears (docs/audit-api.md#project-index). Stores
// written before the index existed are of an older views format, rebuilt
// when opened (format.go).

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

// openProjectIndex loads the set of known projects. OpenStore calls it.
func (s *Store) openProjectIndex() error {
	known := map[string]struct{}{}
	p := key(tagProject).prefix()
	err := scan(s.db, p, nil, func(k, _ []byte) (bool, error) {
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
