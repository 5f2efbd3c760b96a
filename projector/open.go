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

// openRowTail is the length of an open row key after the tool name: the
// separator, the dispatch time, the separator and the dispatch sequence.
const openRowTail = 1 + 8 + 1 + 8

// WaitingCalls computes, per tool name, the calls waiting for their report
// as the views have applied them, with the overdue ones counted against
// now. It reads one iterator (a consistent point in time) over the open
// rows only, one per waiting call: the cost grows with the calls in
// flight, never with the ledger's length. (Rows of calls reported since
// their last compaction are deleted but may still be stepped over as
// tombstones until Pebble compacts them.)
func (s *Store) WaitingCalls(now time.Time) (map[string]WaitingCalls, error) {
	out := map[string]WaitingCalls{}
	p := key(tagOpen).prefix()
	nowMS := now.UnixMilli()
	err := scan(s.db, p, nil, func(k, v []byte) (bool, error) {
		if len(k) < len(p)+openRowTail || len(v) != 8 {
			return false, fmt.Errorf("malformed open row %q", k)
		}
		tool := string(k[len(p) : len(k)-openRowTail])
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
