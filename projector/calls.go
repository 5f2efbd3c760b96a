package projector

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// CallFilter narrows a calls listing. Empty fields do not filter. From and
// To bound the dispatch time (To inclusive); a call held for approval is
// listed at the time it was held.
type CallFilter struct {
	Tool    string
	Status  string // result status: success, failed, canceled, timeout, partial
	State   string // lifecycle: awaiting_approval, paused, dispatched, reported, consumed, rejected
	Agent   string
	Channel string
	From    time.Time
	To      time.Time
}

// maxExamined bounds the index rows one page may examine, so a very
// selective filter answers in bounded time with a cursor to continue.
const maxExamined = 10000

// Calls lists calls of a project matching f, ordered by dispatch time, as
// of the query. It seeks the most selective index for the filter (status,
// then state, tool, agent, channel, else all calls) and checks each
// candidate's state as of the query (docs/views.md).
func (q *Queries) Calls(project string, f CallFilter, at AsOf, cursor string, limit int) (*Page[CallState], error) {
	var vs protocol.Violations
	if !protocol.ValidIdentifier(project) {
		vs.Add("project_id", protocol.VInvalidToken, "must be an identifier, got %q", project)
	}
	vs = append(vs, f.Violations()...)
	if len(vs) > 0 {
		return nil, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid calls query", Violations: vs}
	}
	idx := callsIndex(project, f)
	p := idx.prefix()
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	limit = clampLimit(limit)
	lower, err := decodeCursor(cursor, p)
	if err != nil {
		return nil, err
	}
	// Each bound extends its own copy of idx: appending to idx itself
	// twice would let the second bound overwrite the first in a shared
	// backing array.
	if fromKey := slices.Clip(idx).t(f.From); !f.From.IsZero() && (lower == nil || bytes.Compare(fromKey, lower) > 0) {
		lower = fromKey
	}
	var toKey []byte
	if !f.To.IsZero() {
		toKey = slices.Clip(idx).t(f.To.Add(time.Nanosecond))
	}
	out := &Page[CallState]{AsOfSeq: v.seq, Items: []CallState{}}
	examined := 0
	var last []byte
	err = scan(v.snap, p, lower, func(k, _ []byte) (bool, error) {
		if toKey != nil && bytes.Compare(k, toKey) >= 0 {
			return false, nil
		}
		if len(out.Items) == limit || examined == maxExamined {
			out.NextCursor = encodeCursor(last)
			return false, nil
		}
		examined++
		last = append(last[:0], k...)
		rest := k[len(p):]
		if len(rest) < 8+1+8+1 {
			return false, fmt.Errorf("malformed index key %q", k)
		}
		if trailingU64(rest[:17]) > v.seq {
			return true, nil
		}
		parts := bytes.SplitN(rest[18:], []byte{0}, 2)
		if len(parts) != 2 {
			return false, fmt.Errorf("malformed index key %q", k)
		}
		st, err := loadState(v.snap, project, string(parts[0]), string(parts[1]), v.seq)
		if err != nil || st == nil {
			return err == nil, err
		}
		if matches(st, f) {
			out.Items = append(out.Items, *st)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: calls: %w", err)
	}
	return out, nil
}

// violations lists every problem with the filter's values.
// callsIndex is the index a calls query walks: the most selective for its
// filter (status, then state, tool, agent, channel, else all calls).
func callsIndex(project string, f CallFilter) keyBuf {
	dim, val := dimAll, ""
	switch {
	case f.Status != "":
		dim, val = dimStatus, f.Status
	case f.State != "":
		dim, val = dimState, f.State
	case f.Tool != "":
		dim, val = dimTool, f.Tool
	case f.Agent != "":
		dim, val = dimAgent, f.Agent
	case f.Channel != "":
		dim, val = dimChannel, f.Channel
	}
	idx := key(tagIndex, project, dim)
	if dim != dimAll {
		idx = idx.str(val)
	}
	return idx
}

// CallsCursor checks cursors of a calls query (a cursor belongs to the
// index its filter walks).
func CallsCursor(project string, f CallFilter) CursorCheck {
	return prefixCursor(callsIndex(project, f).prefix())
}

// Violations lists every problem of the filter's fields.
func (f CallFilter) Violations() protocol.Violations {
	var vs protocol.Violations
	if f.Status != "" && !protocol.ValidStatus(f.Status) {
		vs.Add("status", protocol.VInvalidValue, "must be one of success, failed, canceled, timeout, partial; got %q", f.Status)
	}
	switch f.State {
	case "", StateAwaitingApproval, StatePaused, StateDispatched, StateReported, StateConsumed, StateRejected:
	default:
		vs.Add("state", protocol.VInvalidValue, "must be one of awaiting_approval, paused, dispatched, reported, consumed, rejected; got %q", f.State)
	}
	if !f.From.IsZero() && !f.To.IsZero() && f.To.Before(f.From) {
		vs.Add("to", protocol.VInvalidValue, "must not be before from")
	}
	return vs
}

func matches(st *CallState, f CallFilter) bool {
	switch {
	case f.Tool != "" && st.ToolName != f.Tool,
		f.Status != "" && st.Status != f.Status,
		f.State != "" && st.State != f.State,
		f.Agent != "" && st.AgentID != f.Agent,
		f.Channel != "" && st.ChannelID != f.Channel:
		return false
	}
	t, _ := st.listedAt()
	if !f.From.IsZero() && t.Before(f.From) || !f.To.IsZero() && t.After(f.To) {
		return false
	}
	return true
}
