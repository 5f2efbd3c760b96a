package projector

import (
	"encoding/binary"
	"fmt"
	"time"
)

// WaitingCalls is what the views hold of one tool's waiting calls: calls a
// ledger command dispatched and no report has answered yet.
type WaitingCalls struct {
	// Waiting is the number of waiting calls.
	Waiting int
	// OldestDispatch is the dispatch time of the oldest waiting call (the
	// zero time when none waits).
	OldestDispatch time.Time
	// Overdue is the number of waiting calls whose deadline_unix_ms is
	// before the time WaitingCalls was given. Calls without a deadline (dispatched by releases before
	// deadlines were fixed at dispatch) are never overdue.
	Overdue int
}

// CallTool is the tool of waiting (or held) calls as their gauges label
// them: its name, and whether the name was registered in each call's own
// project when the ledger pinned the call's tool definition (its dispatch,
// or its hold for a held call). A name registered only in another project
// is not the call's tool (WaitingConfig.Label).
type CallTool struct {
	Name       string
	Registered bool
}

// registrations answers whether tools are registered in projects before a
// sequence, from the tool rows of one reader, remembering the first
// registration of each project and tool it reads (a computation reads each
// once, however many calls name it).
type registrations struct {
	r     reader
	first map[string]uint64 // project\0tool -> seq of its first tool row; 0: none
}

// before reports whether tool has a tool row in project from an entry
// before seq.
func (g *registrations) before(project, tool string, seq uint64) (bool, error) {
	k := project + "\x00" + tool
	first, ok := g.first[k]
	if !ok {
		err := scan(g.r, key(tagTool, project, tool).prefix(), nil, func(k, _ []byte) (bool, error) {
			first = trailingU64(k)
			return false, nil
		})
		if err != nil {
			return false, fmt.Errorf("tool rows of %s in %s: %w", tool, project, err)
		}
		if g.first == nil {
			g.first = map[string]uint64{}
		}
		g.first[k] = first
	}
	return first != 0 && first < seq, nil
}

// openRowTail is the length of an open row key after the tool name: the
// separator, the dispatch time, the separator and the dispatch sequence.
const openRowTail = 1 + 8 + 1 + 8

// openValueHead is the length of an open row's value before the project:
// the deadline and the sequence the tool's registration is judged at
// (openValue).
const openValueHead = 8 + 8

// WaitingCalls computes, per tool (CallTool), the calls waiting for their
// report as the views have applied them, with the overdue ones counted
// against now. It reads one snapshot: an iterator over the open rows only,
// one per waiting call, and the tool rows of each project and tool among
// them once: the cost grows with the calls in flight, never with the
// ledger's length. (Rows of calls reported since their last compaction are
// deleted but may still be stepped over as tombstones until Pebble
// compacts them.)
func (s *Store) WaitingCalls(now time.Time) (map[CallTool]WaitingCalls, error) {
	out := map[CallTool]WaitingCalls{}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	reg := registrations{r: snap}
	p := key(tagOpen).prefix()
	nowMS := now.UnixMilli()
	err := scan(snap, p, nil, func(k, v []byte) (bool, error) {
		if len(k) < len(p)+openRowTail || len(v) <= openValueHead {
			return false, fmt.Errorf("malformed open row %q", k)
		}
		name := string(k[len(p) : len(k)-openRowTail])
		registered, err := reg.before(string(v[openValueHead:]), name, binary.BigEndian.Uint64(v[8:openValueHead]))
		if err != nil {
			return false, err
		}
		tool := CallTool{Name: name, Registered: registered}
		dispatched := time.Unix(0, int64(binary.BigEndian.Uint64(k[len(k)-openRowTail+1:len(k)-openRowTail+9])))
		deadline := int64(binary.BigEndian.Uint64(v))
		w := out[tool]
		// Rows of one tool are in dispatch order: its first is its oldest.
		if w.Waiting == 0 {
			w.OldestDispatch = dispatched
		}
		w.Waiting++
		if deadline > 0 && deadline < nowMS {
			w.Overdue++
		}
		out[tool] = w
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: waiting calls: %w", err)
	}
	return out, nil
}
