package projector

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cgledger/cgledger/protocol"
)

// AsOf selects the ledger position a query answers for: the views as they
// stood right after sequence Seq, or after the last entry whose time is at or
// before Time. The zero value means the latest applied sequence. Seq wins
// when both are set.
type AsOf struct {
	Seq  uint64
	Time time.Time
}

// Queries answers audit queries from a Store. Each query reads one Pebble
// snapshot, so its answer is consistent even while the projector applies.
type Queries struct {
	store *Store
}

// NewQueries returns the query API over store.
func NewQueries(store *Store) *Queries { return &Queries{store: store} }

// Query limits (every list of the HTTP API shares them: httpapi's limit
// parameter reads them): a limit absent or 0 is DefaultLimit, and above
// MaxLimit is refused.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// view is one query's consistent read of the store at sequence seq.
type view struct {
	snap    *pebble.Snapshot
	seq     uint64
	applied uint64
	// entries reads e rows for item, made on first use: timelines and
	// stories read their entries in sequence order.
	entries *seeker
}

func (v *view) close() {
	if v.entries != nil {
		v.entries.close()
	}
	_ = v.snap.Close()
}

func (q *Queries) open(at AsOf) (*view, error) {
	snap := q.store.db.NewSnapshot()
	v := &view{snap: snap}
	cpRaw, closer, err := snap.Get(metaApplied)
	applied := uint64(0)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		v.close()
		return nil, fmt.Errorf("projector: read checkpoint: %w", err)
	default:
		cp, derr := decodeCheckpoint(cpRaw)
		_ = closer.Close()
		if derr != nil {
			v.close()
			return nil, derr
		}
		applied = cp.Applied
	}
	v.applied = applied
	switch {
	case at.Seq > 0:
		v.seq = min(at.Seq, applied)
	case !at.Time.IsZero():
		v.seq, err = seqAtTime(snap, at.Time)
		if err != nil {
			v.close()
			return nil, err
		}
		v.seq = min(v.seq, applied)
	default:
		v.seq = applied
	}
	return v, nil
}

// seqAtTime finds the last sequence whose time watermark is at or before t:
// one SeekLT on the ts index (docs/views.md).
func seqAtTime(r reader, t time.Time) (uint64, error) {
	p := key(tagTime).prefix()
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: key(tagTime).t(t.Add(time.Nanosecond))})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	if !it.Last() {
		return 0, it.Error()
	}
	return trailingU64(it.Key()), nil
}

func notFound(format string, args ...any) error {
	return &protocol.Error{Code: protocol.CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

func badQuery(field, code, format string, args ...any) error {
	var vs protocol.Violations
	vs.Add(field, code, format, args...)
	return &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid query", Violations: vs}
}

func checkIDs(pairs ...string) error {
	if vs := IDViolations(pairs...); len(vs) > 0 {
		return &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid query", Violations: vs}
	}
	return nil
}

// IDViolations lists the ids (field, value pairs) that are not
// identifiers.
func IDViolations(pairs ...string) protocol.Violations {
	var vs protocol.Violations
	for i := 0; i+1 < len(pairs); i += 2 {
		if !protocol.ValidIdentifier(pairs[i+1]) {
			vs.Add(pairs[i], protocol.VInvalidToken, "must be an identifier, got %q", pairs[i+1])
		}
	}
	return vs
}

// scan iterates rows with prefix p in key order (or reverse), calling fn
// until it returns false.
func scan(r reader, p []byte, lower []byte, fn func(k, v []byte) (bool, error)) error {
	if lower == nil {
		lower = p
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upperBound(p)})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		more, err := fn(it.Key(), it.Value())
		if err != nil || !more {
			return err
		}
	}
	return it.Error()
}

// scanGroup is scan for rows under p within one group of viewsComparer
// (p is at least the group's prefix and a separator): it seeks with the
// group's bloom filters, skipping sstables that hold none of the group.
func scanGroup(r reader, p []byte, fn func(k, v []byte) (bool, error)) error {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upperBound(p)})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.SeekPrefixGE(p); ok; ok = it.Next() {
		more, err := fn(it.Key(), it.Value())
		if err != nil || !more {
			return err
		}
	}
	return it.Error()
}

func get(r reader, k []byte) ([]byte, bool, error) {
	v, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, oneLine(err)
	}
	defer closer.Close()
	return append([]byte(nil), v...), true, nil
}

// seeker reads rows of one prefix in increasing key order with a single
// iterator: each lookup moves the iterator forward from where the last one
// left it (Pebble turns a forward SeekGE into steps), instead of searching
// every level of the LSM afresh as a point Get does.
type seeker struct{ it *pebble.Iterator }

func newSeeker(r reader, p []byte) (*seeker, error) {
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: upperBound(p)})
	if err != nil {
		return nil, err
	}
	return &seeker{it: it}, nil
}

// get returns a copy of the value at k. Keys in increasing order are the
// fast case; any order is correct.
func (s *seeker) get(k []byte) ([]byte, bool, error) {
	if !s.it.SeekGE(k) || !bytes.Equal(s.it.Key(), k) {
		return nil, false, s.it.Error()
	}
	return append([]byte(nil), s.it.Value()...), true, nil
}

func (s *seeker) close() { _ = s.it.Close() }

// item reads an entry from its e row: the entries no timeline holds, and
// the unrecognized, skipped and skip entries, which are listed by sequence.
func (v *view) item(seq uint64) (TimelineItem, error) {
	if v.entries == nil {
		e, err := newSeeker(v.snap, key(tagEntry).prefix())
		if err != nil {
			return TimelineItem{}, err
		}
		v.entries = e
	}
	raw, ok, err := v.entries.get(key(tagEntry).u64(seq))
	if err != nil {
		return TimelineItem{}, err
	}
	if !ok {
		return TimelineItem{}, fmt.Errorf("projector: entry %d indexed but not stored", seq)
	}
	return v.itemFrom(seq, raw)
}

// itemFrom decodes an entry's row (an e row or a tl row).
func (v *view) itemFrom(seq uint64, raw []byte) (TimelineItem, error) {
	se, err := decodeEntry(raw)
	if err != nil {
		return TimelineItem{}, fmt.Errorf("projector: decode entry %d: %w", seq, err)
	}
	it := TimelineItem{Seq: seq, Time: se.Time, Kind: se.Kind, Subject: se.Subject, Headers: se.Headers}
	if err := v.annotate(&it, se); err != nil {
		return TimelineItem{}, fmt.Errorf("projector: entry %d: %w", seq, err)
	}
	if json.Valid(se.Data) && len(bytes.TrimSpace(se.Data)) > 0 {
		it.Data = se.Data
	} else {
		it.Data, _ = json.Marshal(string(se.Data))
	}
	return it, nil
}

// placedItems appends the entries of the tl rows under prefix p at or
// before the view's sequence.
func (v *view) placedItems(items []TimelineItem, p []byte) ([]TimelineItem, error) {
	err := scanGroup(v.snap, p, func(k, val []byte) (bool, error) {
		seq := trailingU64(k)
		if seq > v.seq {
			return true, nil
		}
		item, err := v.itemFrom(seq, val)
		items = append(items, item)
		return true, err
	})
	return items, err
}

func sortItems(items []TimelineItem) {
	slices.SortFunc(items, func(a, b TimelineItem) int { return cmp.Compare(a.Seq, b.Seq) })
}

// Timeline is every command, card, report, duplicate, wakeup, consumption
// and rejection of a turn, in ledger order.
type Timeline struct {
	AsOfSeq     uint64         `json:"as_of_seq"`
	ProjectID   string         `json:"project_id"`
	AgentTurnID string         `json:"agent_turn_id"`
	Items       []TimelineItem `json:"items"`
}

// Timeline answers a turn's timeline.
func (q *Queries) Timeline(project, turn string, at AsOf) (*Timeline, error) {
	if err := checkIDs("project_id", project, "agent_turn_id", turn); err != nil {
		return nil, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	out := &Timeline{AsOfSeq: v.seq, ProjectID: project, AgentTurnID: turn, Items: []TimelineItem{}}
	// The turn's rows are grouped by call, so the items are put back in
	// ledger order.
	out.Items, err = v.placedItems(out.Items, key(tagTimeline, project, turn).prefix())
	if err != nil {
		return nil, fmt.Errorf("projector: timeline %s: %w", turn, err)
	}
	sortItems(out.Items)
	if len(out.Items) == 0 {
		return nil, notFound("turn %s has no entries in project %s as of seq %d", turn, project, v.seq)
	}
	return out, nil
}

// CallStory is everything that happened to a tool_call_id: the state of
// each call with that id (one per turn) and every entry, in ledger order.
type CallStory struct {
	AsOfSeq    uint64         `json:"as_of_seq"`
	ProjectID  string         `json:"project_id"`
	ToolCallID string         `json:"tool_call_id"`
	Calls      []CallState    `json:"calls"`
	Items      []TimelineItem `json:"items"`
}

// CallStory answers a call's story; turn narrows it to one turn when ids
// repeat across turns (empty means every turn).
func (q *Queries) CallStory(project, callID, turn string, at AsOf) (*CallStory, error) {
	pairs := []string{"project_id", project, "tool_call_id", callID}
	if turn != "" {
		pairs = append(pairs, "agent_turn_id", turn)
	}
	if err := checkIDs(pairs...); err != nil {
		return nil, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	out := &CallStory{AsOfSeq: v.seq, ProjectID: project, ToolCallID: callID, Calls: []CallState{}, Items: []TimelineItem{}}
	turns := []string{turn}
	if turn == "" {
		turns = nil
		p := key(tagStory, project, callID).prefix()
		err = scanGroup(v.snap, p, func(k, _ []byte) (bool, error) {
			turns = append(turns, string(k[len(p):]))
			return true, nil
		})
		if err != nil {
			return nil, fmt.Errorf("projector: call %s: %w", callID, err)
		}
	}
	var order []string
	for _, t := range turns {
		n := len(out.Items)
		out.Items, err = v.placedItems(out.Items, key(tagTimeline, project, t, callID).prefix())
		if err != nil {
			return nil, fmt.Errorf("projector: call %s: %w", callID, err)
		}
		if len(out.Items) > n {
			order = append(order, t)
		}
	}
	if len(out.Items) == 0 {
		return nil, notFound("call %s has no entries in project %s as of seq %d", callID, project, v.seq)
	}
	sortItems(out.Items)
	for _, t := range order {
		st, err := loadState(v.snap, project, t, callID, v.seq)
		if err != nil {
			return nil, err
		}
		if st != nil {
			out.Calls = append(out.Calls, *st)
		}
	}
	return out, nil
}

// CallState answers one call's state.
func (q *Queries) CallState(project, turn, callID string, at AsOf) (*CallState, uint64, error) {
	if err := checkIDs("project_id", project, "agent_turn_id", turn, "tool_call_id", callID); err != nil {
		return nil, 0, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, 0, err
	}
	defer v.close()
	st, err := loadState(v.snap, project, turn, callID, v.seq)
	if err != nil {
		return nil, 0, err
	}
	if st == nil {
		return nil, v.seq, notFound("call %s/%s not found in project %s as of seq %d", turn, callID, project, v.seq)
	}
	return st, v.seq, nil
}

// Page is one page of a list query.
type Page[T any] struct {
	AsOfSeq uint64 `json:"as_of_seq"`
	Items   []T    `json:"items"`
	// NextCursor continues the listing; empty when there is no more.
	NextCursor string `json:"next_cursor,omitempty"`
}

func clampLimit(limit int) int {
	switch {
	case limit <= 0:
		return DefaultLimit
	case limit > MaxLimit:
		return MaxLimit
	}
	return limit
}

func encodeCursor(k []byte) string { return base64.RawURLEncoding.EncodeToString(k) }

// cursorEncoding decodes cursors. They are canonical encodings (nothing in
// the unused bits), so a strict decode refuses a string such as "zz" that
// only decodes loosely, whichever list it is offered to.
var cursorEncoding = base64.RawURLEncoding.Strict()

// CursorCheck reports whether a cursor belongs to one query, without
// running it: the HTTP API lists a foreign cursor with the other parameter
// problems.
type CursorCheck func(c string) error

// prefixCursor checks cursors of key-ordered lists under prefix p.
func prefixCursor(p []byte) CursorCheck {
	return func(c string) error { _, err := decodeCursor(c, p); return err }
}

// seqCursor checks sequence cursors of scope.
func seqCursor(scope string) CursorCheck {
	return func(c string) error { _, err := decodeSeqCursor(c, scope); return err }
}

// decodeCursor checks the cursor belongs to prefix p and returns the key to
// resume strictly after.
func decodeCursor(c string, p []byte) ([]byte, error) {
	if c == "" {
		return nil, nil
	}
	k, err := cursorEncoding.DecodeString(c)
	if err != nil || !bytes.HasPrefix(k, p) {
		return nil, badQuery("cursor", protocol.VInvalidValue, "is not a cursor of this query")
	}
	return append(k, 0), nil
}

// Inbox answers an agent's Inbox: reported results in arrival order with
// their state as of the query. state is "pending", "consumed" or "all" ("").
func (q *Queries) Inbox(project, agent, state string, at AsOf, cursor string, limit int) (*Page[InboxEntry], error) {
	if err := checkIDs("project_id", project, "agent_id", agent); err != nil {
		return nil, err
	}
	switch state {
	case "", "all", InboxPending, InboxConsumed:
	default:
		return nil, badQuery("state", protocol.VInvalidValue, "must be pending, consumed or all, got %q", state)
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	limit = clampLimit(limit)
	after, err := decodeSeqCursor(cursor, inboxScope(project, agent, state))
	if err != nil {
		return nil, err
	}
	out := &Page[InboxEntry]{AsOfSeq: v.seq, Items: []InboxEntry{}}
	inboxPrefix := key(tagInbox, project, agent).prefix()
	p := inboxPrefix
	// Pending entries now: walk the pending index, whose size is the
	// number of pending entries, not the agent's whole history. Its rows
	// are exactly the entries not consumed as of the applied sequence (a
	// consumption deletes its pend row in the batch that writes its inboxc
	// row), so no consumption is looked up, and the entries themselves are
	// read in order with one iterator: at a million calls, a fresh lookup
	// through every level per entry was most of a page's cost.
	pendingNow := state == InboxPending && v.seq == v.applied
	var entries *seeker
	if pendingNow {
		p = key(tagPending, project, agent).prefix()
		if entries, err = newSeeker(v.snap, inboxPrefix); err != nil {
			return nil, fmt.Errorf("projector: inbox %s: %w", agent, err)
		}
		defer entries.close()
	}
	lower := append(append([]byte(nil), p...), binary.BigEndian.AppendUint64(nil, after+1)...)
	err = scan(v.snap, p, lower, func(k, val []byte) (bool, error) {
		seq := trailingU64(k)
		if seq > v.seq {
			return false, nil
		}
		if len(out.Items) == limit {
			out.NextCursor = encodeSeqCursor(inboxScope(project, agent, state), out.Items[len(out.Items)-1].ReportSeq)
			return false, nil
		}
		if pendingNow {
			raw, ok, err := entries.get(key(tagInbox, project, agent).u64(seq))
			if err != nil || !ok {
				return false, fmt.Errorf("pending inbox entry %d not stored: %v", seq, err)
			}
			val = raw
		}
		var e InboxEntry
		if err := json.Unmarshal(val, &e); err != nil {
			return false, fmt.Errorf("decode inbox entry %d: %w", seq, err)
		}
		e.State = InboxPending
		if pendingNow {
			out.Items = append(out.Items, e)
			return true, nil
		}
		if c, ok, err := get(v.snap, key(tagConsumed, project, agent).u64(seq)); err != nil {
			return false, err
		} else if ok && len(c) == 16 && binary.BigEndian.Uint64(c) <= v.seq {
			t := time.Unix(0, int64(binary.BigEndian.Uint64(c[8:]))).UTC()
			e.State, e.ConsumedSeq, e.ConsumedAt = InboxConsumed, binary.BigEndian.Uint64(c), &t
		}
		if state == "" || state == "all" || state == e.State {
			out.Items = append(out.Items, e)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: inbox %s: %w", agent, err)
	}
	return out, nil
}

// Sequence cursors name the last sequence returned and the list they page
// (scope: the Inbox's project, agent and state filter, or the list's tag),
// so a cursor handed to another list or filter is refused, not misread.
func encodeSeqCursor(scope string, seq uint64) string {
	b := binary.BigEndian.AppendUint64([]byte("r"), seq)
	return base64.RawURLEncoding.EncodeToString(append(b, scope...))
}

func decodeSeqCursor(c, scope string) (uint64, error) {
	if c == "" {
		return 0, nil
	}
	b, err := cursorEncoding.DecodeString(c)
	if err != nil || len(b) < 9 || b[0] != 'r' || string(b[9:]) != scope {
		return 0, badQuery("cursor", protocol.VInvalidValue, "is not a cursor of this query")
	}
	return binary.BigEndian.Uint64(b[1:9]), nil
}

// InboxCursor checks cursors of an Inbox listing.
func InboxCursor(project, agent, state string) CursorCheck {
	return seqCursor(inboxScope(project, agent, state))
}

// TurnCardsCursor checks cursors of a turn's cards.
func TurnCardsCursor(project, turn string) CursorCheck {
	return prefixCursor(key(tagTurnCard, project, turn).prefix())
}

// inboxScope is the scope of an Inbox page's cursor: "" and "all" are the
// same filter.
func inboxScope(project, agent, state string) string {
	if state == "" {
		state = "all"
	}
	return project + "\x00" + agent + "\x00" + state
}

// Card answers a card by id as of the query, with every version up to it.
func (q *Queries) Card(project, cardID string, at AsOf) (*CardResult, error) {
	if err := checkIDs("project_id", project, "card_id", cardID); err != nil {
		return nil, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	out := &CardResult{AsOfSeq: v.seq}
	err = scanGroup(v.snap, key(tagCard, project, cardID).prefix(), func(k, val []byte) (bool, error) {
		seq := trailingU64(k)
		if seq > v.seq {
			return false, nil
		}
		t, card, err := decodeCardRow(val)
		out.Versions = append(out.Versions, CardVersion{Seq: seq, Time: t, Card: append(json.RawMessage(nil), card...)})
		return true, err
	})
	if err != nil {
		return nil, fmt.Errorf("projector: card %s: %w", cardID, err)
	}
	if len(out.Versions) == 0 {
		return nil, notFound("card %s not found in project %s as of seq %d", cardID, project, v.seq)
	}
	out.Card = out.Versions[len(out.Versions)-1]
	return out, nil
}

// CardResult is a card's latest version as of the query and all versions up to it.
type CardResult struct {
	AsOfSeq  uint64        `json:"as_of_seq"`
	Card     CardVersion   `json:"card"`
	Versions []CardVersion `json:"versions"`
}

// TurnCards answers every card of a turn (each version), in ledger order.
func (q *Queries) TurnCards(project, turn string, at AsOf) (*Page[CardVersion], error) {
	return q.turnCards(project, turn, at, "", math.MaxInt)
}

// TurnCardsPage answers one page of a turn's cards (each version), in
// ledger order.
func (q *Queries) TurnCardsPage(project, turn string, at AsOf, cursor string, limit int) (*Page[CardVersion], error) {
	return q.turnCards(project, turn, at, cursor, clampLimit(limit))
}

func (q *Queries) turnCards(project, turn string, at AsOf, cursor string, limit int) (*Page[CardVersion], error) {
	if err := checkIDs("project_id", project, "agent_turn_id", turn); err != nil {
		return nil, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	p := key(tagTurnCard, project, turn).prefix()
	lower, err := decodeCursor(cursor, p)
	if err != nil {
		return nil, err
	}
	out := &Page[CardVersion]{AsOfSeq: v.seq, Items: []CardVersion{}}
	var last []byte
	err = scan(v.snap, p, lower, func(k, val []byte) (bool, error) {
		seq := trailingU64(k)
		if seq > v.seq {
			return false, nil
		}
		if len(out.Items) == limit {
			out.NextCursor = encodeCursor(last)
			return false, nil
		}
		last = append(last[:0], k...)
		raw, ok, err := get(v.snap, key(tagCard, project, string(val)).u64(seq))
		if err != nil || !ok {
			return false, fmt.Errorf("card %s at %d indexed but not stored: %v", val, seq, err)
		}
		t, card, err := decodeCardRow(raw)
		out.Items = append(out.Items, CardVersion{Seq: seq, Time: t, Card: card})
		return true, err
	})
	if err != nil {
		return nil, fmt.Errorf("projector: cards of turn %s: %w", turn, err)
	}
	return out, nil
}

// Roster answers an agent's worker target as of the query.
func (q *Queries) Roster(project, agent string, at AsOf) (protocol.RosterResult, uint64, error) {
	if err := checkIDs("project_id", project, "agent_id", agent); err != nil {
		return protocol.RosterResult{}, 0, err
	}
	v, err := q.open(at)
	if err != nil {
		return protocol.RosterResult{}, 0, err
	}
	defer v.close()
	it, err := v.snap.NewIter(&pebble.IterOptions{LowerBound: key(tagRoster, project, agent).prefix(), UpperBound: key(tagRoster, project, agent).u64(v.seq + 1)})
	if err != nil {
		return protocol.RosterResult{}, 0, err
	}
	defer it.Close()
	if !it.Last() {
		if err := it.Error(); err != nil {
			return protocol.RosterResult{}, 0, err
		}
		return protocol.RosterResult{}, v.seq, notFound("agent %s has no roster entry in project %s as of seq %d", agent, project, v.seq)
	}
	return protocol.RosterResult{RosterEntry: protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: string(it.Value())}, Seq: trailingU64(it.Key())}, v.seq, nil
}
