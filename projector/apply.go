package projector

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// reader is what view lookups need; *pebble.DB, *pebble.Batch (indexed) and
// *pebble.Snapshot all provide it.
type reader interface {
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
	Get(key []byte) ([]byte, io.Closer, error)
}

// checkpoint is the meta\0applied row: the last applied sequence, the chain
// head after it, and the time watermark (the greatest entry time so far).
type checkpoint struct {
	Applied   uint64
	Head      protocol.Link
	Watermark time.Time
}

func (c checkpoint) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, c.Applied)
	b = append(b, c.Head[:]...)
	return binary.BigEndian.AppendUint64(b, uint64(c.Watermark.UnixNano()))
}

func decodeCheckpoint(b []byte) (checkpoint, error) {
	var c checkpoint
	if len(b) != 8+len(c.Head)+8 {
		return c, fmt.Errorf("checkpoint row has %d bytes", len(b))
	}
	c.Applied = binary.BigEndian.Uint64(b)
	copy(c.Head[:], b[8:])
	c.Watermark = time.Unix(0, int64(binary.BigEndian.Uint64(b[8+len(c.Head):]))).UTC()
	return c, nil
}

// ErrCorruptEntry marks a ledger entry the projector cannot apply (a known
// kind whose data does not decode or validate). The projector stops there
// until a skip entry for that sequence exists (ledger.Ledger.Skip).
var ErrCorruptEntry = errors.New("corrupt ledger entry")

// ErrGap marks a missing sequence in the ledger stream.
var ErrGap = errors.New("gap in ledger sequence")

func corrupt(seq uint64, format string, args ...any) error {
	return fmt.Errorf("%w at seq %d: %s", ErrCorruptEntry, seq, fmt.Sprintf(format, args...))
}

// applier folds entries into one batch. It never reads the batch: call
// states it writes are kept in pending, and anything else it reads was
// committed before the batch began (the store's cache or the database).
type applier struct {
	b       *pebble.Batch
	cp      checkpoint
	store   *Store
	pending map[string]*CallState

	// skippedHere holds the entries skipped in this batch, for their skip
	// entries later in the same batch.
	skippedHere map[uint64]skipMark
	// nUnrecognized and nSkipped count this batch's entries of those kinds,
	// for the metrics once it commits.
	nUnrecognized, nSkipped int

	// entryTime is the time the current entry's row holds.
	entryTime time.Time
	// body is the current entry's row value (encodeEntry). It goes into
	// the tl row of the turn the entry is placed in, or into an e row when
	// it is placed in none (docs/views.md#rows); placed says which.
	body   []byte
	placed bool
	// stories are the cs rows this batch wrote: a call's entries mostly
	// sit in one batch, and a cs row is written once per call and turn.
	stories map[string]struct{}
	// newProjects are the projects whose first entry is in this batch; the
	// store's set learns them once it commits.
	newProjects map[string]struct{}

	// prev is the batch before this one while it is still being committed
	// (a catch-up commits one batch while it builds the next): its call
	// states and new projects are not in the store yet, so lookups see
	// them here first.
	prev *applier
}

func newApplier(s *Store, cp checkpoint) *applier {
	if cp.Applied == 0 {
		// A store at sequence 0 holds no rows (fresh, or reset for a
		// rebuild): no project is known.
		s.projects.reset()
	}
	return &applier{b: s.db.NewBatch(), cp: cp, store: s, pending: map[string]*CallState{}}
}

// newApplierAfter starts the batch after prev, which may still be being
// committed.
func newApplierAfter(s *Store, cp checkpoint, prev *applier) *applier {
	a := newApplier(s, cp)
	a.prev = prev
	return a
}

// seal writes the checkpoint once per batch, just before it commits:
// written with every entry it was one of its memtable inserts, each
// overwritten by the next.
func (a *applier) seal() {
	a.set(metaApplied, a.cp.encode())
}

// noteProject writes the proj row of the project a project-scoped row
// (projectRowTags) names, the first time a project appears: its first
// entry is the one being applied. Names that are not identifiers (the
// unrouted "_" of rejections) are not projects.
func (a *applier) noteProject(k []byte) {
	i := bytes.IndexByte(k, 0)
	if i < 0 || !isProjectRowTag(k[:i]) {
		return
	}
	rest := k[i+1:]
	j := bytes.IndexByte(rest, 0)
	if j < 0 {
		return
	}
	name := rest[:j]
	if _, ok := a.newProjects[string(name)]; ok || a.store.projects.has(name) {
		return
	}
	if a.prev != nil {
		if _, ok := a.prev.newProjects[string(name)]; ok {
			return
		}
	}
	project := string(name)
	if !protocol.ValidIdentifier(project) {
		return
	}
	if a.newProjects == nil {
		a.newProjects = map[string]struct{}{}
	}
	a.newProjects[project] = struct{}{}
	if err := a.b.Set(key(tagProject, project), encodeProjectRow(a.cp.Applied, a.entryTime), nil); err != nil {
		panic(fmt.Sprintf("projector: batch set: %v", err))
	}
}

func stateKey(project, turn, call string) string { return project + "\x00" + turn + "\x00" + call }

// state returns a copy of a call's newest state, or nil.
func (a *applier) state(project, turn, call string) (*CallState, error) {
	k := stateKey(project, turn, call)
	if st, ok := a.pending[k]; ok {
		c := *st
		return &c, nil
	}
	if a.prev != nil {
		if st, ok := a.prev.pending[k]; ok {
			c := *st
			return &c, nil
		}
	}
	if st, ok := a.store.cachedState(k); ok {
		if st == nil {
			return nil, nil
		}
		c := *st
		return &c, nil
	}
	st, err := loadState(a.store.db, project, turn, call, a.cp.Applied)
	if err != nil {
		return nil, err
	}
	a.store.cacheState(k, st)
	if st == nil {
		return nil, nil
	}
	c := *st
	return &c, nil
}

// View kinds of entries the projector records without applying them
// (docs/views.md). Neither is ever a CG-Entry-Kind.
const (
	// KindUnrecognized is a stream message that is not a ledger entry
	// (protocol.RecognizeEntry).
	KindUnrecognized = protocol.ViewKindUnrecognized
	// KindSkipped is an entry that could not be applied and that a skip
	// entry (ledger.Ledger.Skip) told the projector to pass.
	KindSkipped = "skipped"
)

// apply folds entry e (which must be cp.Applied+1) into the batch and
// advances the checkpoint.
func (a *applier) apply(e protocol.Entry) error {
	if e.Seq != a.cp.Applied+1 {
		return fmt.Errorf("%w: expected seq %d, got %d", ErrGap, a.cp.Applied+1, e.Seq)
	}
	// The chain link is over the headers as stored (record takes raw);
	// everything else reads them as the chain does, case-insensitively
	// (protocol.CanonicalHeaders).
	raw := e
	e.Headers = protocol.CanonicalHeaders(e.Headers)
	h := nats.Header(e.Headers)
	rec := protocol.RecognizeEntry(e.Subject, h)
	if rec.Unrecognized() {
		a.unrecognized(raw, rec)
		return nil
	}
	kind := rec.Kind
	// Entries without CG-Time (published by others) get no time: their
	// stream timestamp would differ in a replay.
	t, _ := protocol.EntryTime(h)
	a.record(raw, e.Headers, kind, t, true)

	var err error
	ev := event{seq: e.Seq, t: t, kind: kind, h: h, data: e.Data, subject: e.Subject}
	switch protocol.EntryKind(kind) {
	case protocol.KindCard:
		err = a.card(ev)
	case protocol.KindCommand:
		err = a.command(ev, h.Get(protocol.HeaderEntryKind) != "")
	case protocol.KindReport:
		err = a.report(ev)
	case protocol.KindDuplicate:
		err = a.duplicate(ev)
	case protocol.KindWakeup:
		err = a.wakeup(ev)
	case protocol.KindWakeupSkipped:
		err = a.wakeupSkipped(ev)
	case protocol.KindConsumed:
		err = a.consumed(ev)
	case protocol.KindRejection:
		err = a.rejection(ev)
	case protocol.KindRoster:
		err = a.roster(ev)
	case protocol.KindTool:
		err = a.tool(ev)
	case protocol.KindCancel:
		err = a.cancel(ev)
	case protocol.KindAttempt:
		err = a.attempt(ev)
	case protocol.KindPrepared, protocol.KindDecision:
		err = a.twoPhase(ev)
	case protocol.KindSkip:
		err = a.skip(ev)
	case protocol.KindHeld:
		err = a.held(ev)
	case protocol.KindApproval:
		err = a.approval(ev)
	case protocol.KindResolution:
		err = a.resolution(ev)
	case protocol.KindRedrive:
		err = a.redrive(ev)
	case protocol.KindToolPause:
		err = a.toolPause(ev)
	case protocol.ViewKindExternalWakeup:
		// Not the ledger's own: only placed in the timeline of the turn
		// its headers name (docs/views.md).
		a.place(ev, e.Subject, e.Headers)
	default:
		// RecognizeEntry only answers kinds handled above; reaching here
		// means the two disagree, which must not pass silently.
		err = corrupt(e.Seq, "entry kind %q is recognized but has no view", kind)
	}
	if err == nil {
		a.storeUnplaced(e.Seq)
	}
	return err
}

// record writes the rows every entry has (the entry, its chain link, its
// as-of-time row) and advances the checkpoint past it. Only a trusted time
// (an entry the projector could apply) moves the time watermark: one stray
// message claiming a far-future CG-Time would otherwise pin every later
// entry to that time in as-of-time queries. e is the entry as stored: its
// link covers the headers as they are, the row keeps canon, the same
// headers with canonical names (protocol.CanonicalHeaders).
func (a *applier) record(e protocol.Entry, canon map[string][]string, kind string, t time.Time, trusted bool) {
	if trusted && t.After(a.cp.Watermark) {
		a.cp.Watermark = t
	}
	a.cp.Head = protocol.NextLink(a.cp.Head, e.Seq, e.Subject, nats.Header(e.Headers), e.Data)
	a.cp.Applied, a.entryTime = e.Seq, t
	// Only the chained headers are kept: JetStream's own (Nats-*) steer the
	// server and differ when the same entries are replayed elsewhere.
	a.body = encodeEntry(storedEntry{Subject: e.Subject, Kind: kind, Headers: canon, Data: e.Data, Time: t})
	a.placed = false
	a.set(key(tagLink).u64(e.Seq), a.cp.Head[:])
	a.set(key(tagTime).t(a.cp.Watermark).u64(e.Seq), nil)
}

// storeUnplaced writes the current entry's e row when no timeline holds it.
// Unrecognized, skipped and skip entries always have one (they are listed
// by sequence: Queries.Unrecognized, Skipped, Skips), written where they
// are recorded.
func (a *applier) storeUnplaced(seq uint64) {
	if !a.placed {
		a.set(key(tagEntry).u64(seq), a.body)
	}
}

// unrecognized records a stream message that is not a ledger entry: it
// stays in the chain and the views (listed, and in the timeline of the turn
// it names, if any) without changing any other view. e is as stored.
func (a *applier) unrecognized(e protocol.Entry, rec protocol.Recognition) {
	t, _ := protocol.EntryTime(nats.Header(e.Headers))
	canon := protocol.CanonicalHeaders(e.Headers)
	a.record(e, canon, KindUnrecognized, t, false)
	a.set(key(tagEntry).u64(e.Seq), a.body)
	a.set(key(tagUnrec).u64(e.Seq), []byte(rec.Code))
	a.place(event{seq: e.Seq, kind: KindUnrecognized}, e.Subject, canon)
	a.nUnrecognized++
}

// lost records a range of entries lost before they were archived and
// moves past it: the chain goes on from the link after it when that is
// known, else from zero (what follows cannot be chained to what was lost).
func (a *applier) lost(r stream.LostRange) {
	a.set(key(tagLost).u64(r.First), binary.BigEndian.AppendUint64(nil, r.Last))
	a.cp.Applied = r.Last
	a.cp.Head = protocol.Link{}
	if r.NextKnown {
		a.cp.Head = r.Next
	}
}

// skipped records entry e, which could not be applied, as skipped by the
// skip entry s, with no effect on any other view.
func (a *applier) skipped(e protocol.Entry, s protocol.SkipRecord) {
	t, _ := protocol.EntryTime(nats.Header(e.Headers))
	canon := protocol.CanonicalHeaders(e.Headers)
	a.record(e, canon, KindSkipped, t, false)
	a.set(key(tagEntry).u64(e.Seq), a.body)
	a.set(key(tagSkipped).u64(e.Seq), appendSkipRow(nil, s.SkipSeq, s.Reason))
	a.place(event{seq: e.Seq, kind: KindSkipped}, e.Subject, canon)
	if a.skippedHere == nil {
		a.skippedHere = map[uint64]skipMark{}
	}
	a.skippedHere[e.Seq] = skipMark{by: s.SkipSeq, subject: e.Subject, headers: protocol.ChainedHeaders(canon)}
	a.nSkipped++
}

// skipMark is what the applier remembers of an entry it skipped in the
// current batch, which it cannot read back from the batch.
type skipMark struct {
	by      uint64
	subject string
	headers map[string][]string
}

// appendSkipRow encodes the sk and skp rows: a sequence, then the reason.
func appendSkipRow(b []byte, seq uint64, reason string) []byte {
	return append(binary.BigEndian.AppendUint64(b, seq), reason...)
}

// skip applies a skip entry: it is listed, and placed in the timeline of the
// entry it skipped. A skip entry that is not valid (protocol.ParseSkip) or
// names an entry that applied fine has no effect beyond its own rows.
func (a *applier) skip(ev event) error {
	var se protocol.SkipEntry
	if err := decode(ev, &se); err != nil {
		return err
	}
	sub, err := protocol.ParseSubject(ev.subject)
	if err != nil {
		return corrupt(ev.seq, "skip entry subject: %v", err)
	}
	s, ok := protocol.ParseSkip(ev.seq, ev.subject, ev.h, ev.data, sub.Seq)
	if !ok {
		return nil
	}
	a.set(key(tagSkip).u64(ev.seq), appendSkipRow(nil, s.Seq, s.Reason))
	// Listed by sequence (Queries.Skips) even when placed in a timeline.
	a.set(key(tagEntry).u64(ev.seq), a.body)
	a.placed = true
	mark, ok, err := a.skippedBy(s.Seq)
	if err != nil || !ok || mark.by != ev.seq {
		return err
	}
	a.place(ev, mark.subject, mark.headers)
	return nil
}

// skippedBy returns how entry seq was skipped, from this batch or from the
// committed views; ok is false when it was not skipped.
func (a *applier) skippedBy(seq uint64) (skipMark, bool, error) {
	if m, ok := a.skippedHere[seq]; ok {
		return m, true, nil
	}
	row, ok, err := get(a.store.db, key(tagSkipped).u64(seq))
	if err != nil || !ok || len(row) < 8 {
		return skipMark{}, false, err
	}
	raw, ok, err := get(a.store.db, key(tagEntry).u64(seq))
	if err != nil || !ok {
		return skipMark{}, false, fmt.Errorf("projector: skipped entry %d not stored: %v", seq, err)
	}
	se, err := decodeEntry(raw)
	if err != nil {
		return skipMark{}, false, fmt.Errorf("projector: decode skipped entry %d: %w", seq, err)
	}
	return skipMark{by: binary.BigEndian.Uint64(row), subject: se.Subject, headers: se.Headers}, true, nil
}

// place puts an entry the projector does not apply into the timeline and
// call story its subject or headers name, if they name a turn.
func (a *applier) place(ev event, subject string, headers map[string][]string) {
	h := nats.Header(headers)
	var project, turn, call string
	if sub, err := protocol.ParseSubject(subject); err == nil {
		if sub.Project != protocol.Unrouted {
			project = sub.Project
		}
		turn, call = sub.AgentTurnID, sub.ToolCallID
	}
	if project == "" {
		project = protocol.HeaderGet(h, protocol.HeaderProjectID)
	}
	if turn == "" {
		turn = protocol.HeaderGet(h, protocol.HeaderAgentTurnID)
	}
	if call == "" {
		call = protocol.HeaderGet(h, protocol.HeaderToolCallID)
	}
	a.trace(ev, project, turn, call)
}

type event struct {
	seq     uint64
	t       time.Time
	kind    string
	h       nats.Header
	data    []byte
	subject string
}

func (a *applier) set(k, v []byte) {
	// Batch.Set only fails on a closed or read-only batch, which would be a
	// programming error here.
	if err := a.b.Set(k, v, nil); err != nil {
		panic(fmt.Sprintf("projector: batch set: %v", err))
	}
	a.noteProject(k)
}

func (a *applier) del(k []byte) {
	if err := a.b.Delete(k, nil); err != nil {
		panic(fmt.Sprintf("projector: batch delete: %v", err))
	}
}

func decode(ev event, v any) error {
	if err := json.Unmarshal(ev.data, v); err != nil {
		return corrupt(ev.seq, "%s entry data does not decode: %v", ev.kind, err)
	}
	return nil
}

// trace places the entry in its turn's timeline: the tl row holds the
// entry itself, under the call it names (if any), so that a turn's entries
// and a call's entries are each one range of keys. The call story's cs row
// only says that the call has entries in that turn.
func (a *applier) trace(ev event, project, turn, call string) {
	if !protocol.ValidIdentifier(project) || !protocol.ValidIdentifier(turn) {
		return
	}
	if !protocol.ValidIdentifier(call) {
		call = ""
	}
	a.set(key(tagTimeline, project, turn, call).u64(ev.seq), a.body)
	a.placed = true
	if call != "" {
		a.story(project, call, turn)
	}
}

// story writes a call's cs row for a turn unless this batch, the one being
// committed before it or the store's cache of recent ones already has. The
// row is the same whenever it is written, so writing it again changes
// nothing but the work.
func (a *applier) story(project, call, turn string) {
	k := key(tagStory, project, call, turn)
	if _, ok := a.stories[string(k)]; ok {
		return
	}
	if a.prev != nil {
		if _, ok := a.prev.stories[string(k)]; ok {
			return
		}
	}
	if a.store.storyKnown(string(k)) {
		return
	}
	if a.stories == nil {
		a.stories = map[string]struct{}{}
	}
	a.stories[string(k)] = struct{}{}
	a.set(k, nil)
}

func (a *applier) card(ev event) error {
	var c protocol.Card
	if err := decode(ev, &c); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(c.ProjectID) || !protocol.ValidIdentifier(c.CardID) {
		return corrupt(ev.seq, "card entry without valid project_id/card_id")
	}
	a.set(key(tagCard, c.ProjectID, c.CardID).u64(ev.seq), appendCardRow(nil, ev.t, ev.data))
	if protocol.ValidIdentifier(c.AgentTurnID) {
		a.set(key(tagTurnCard, c.ProjectID, c.AgentTurnID).u64(ev.seq), []byte(c.CardID))
	}
	a.trace(ev, c.ProjectID, c.AgentTurnID, c.ToolCallID)
	return nil
}

func (a *applier) command(ev event, fromLedger bool) error {
	cmd, err := protocol.ParseToolCommand(ev.subject, ev.h, ev.data)
	if protocol.HeaderGet(ev.h, protocol.HeaderConformance) != "" {
		// A conformance run's command (conformance.command): written by the
		// ledger, often malformed on purpose, and no dispatch: it is placed
		// in the timeline of the turn it names and makes no call.
		sub, _ := protocol.ParseSubject(ev.subject)
		id, _ := protocol.ParseIdentity(ev.h, protocol.IdentityRules{})
		a.trace(ev, sub.Project, id.AgentTurnID, id.ToolCallID)
		return nil
	}
	if err != nil {
		if fromLedger {
			return corrupt(ev.seq, "command written by the ledger does not validate: %v", err)
		}
		// An external publish on a command subject that does not follow the
		// protocol: keep it in the timeline if it names a turn.
		sub, _ := protocol.ParseSubject(ev.subject)
		id, _ := protocol.ParseIdentity(ev.h, protocol.IdentityRules{})
		a.trace(ev, sub.Project, id.AgentTurnID, id.ToolCallID)
		return nil
	}
	sub, id := cmd.Subject, cmd.Identity
	st, err := a.state(sub.Project, id.AgentTurnID, id.ToolCallID)
	if err != nil {
		return err
	}
	if st == nil || st.State == StateRejected && st.DispatchedSeq == 0 {
		prev := st
		st = &CallState{ProjectID: sub.Project, AgentTurnID: id.AgentTurnID, ToolCallID: id.ToolCallID}
		if prev != nil {
			st.Rejections, st.LastRejection, st.RejectedSeq = prev.Rejections, prev.LastRejection, prev.RejectedSeq
		}
	}
	if st.DispatchedSeq == 0 {
		t := ev.t
		st.ChannelID, st.AgentID, st.TurnEpoch, st.StepID = sub.Channel, id.AgentID, id.TurnEpoch, id.StepID
		st.ToolName, st.Subject, st.ToolCallCardID = cmd.Payload.ToolName, ev.subject, cmd.Payload.ToolCallCardID
		st.State, st.DispatchedSeq, st.DispatchedAt = StateDispatched, ev.seq, &t
		if st.HeldSeq == 0 {
			a.index(st, dimAll, "")
			a.index(st, dimTool, st.ToolName)
			a.index(st, dimAgent, st.AgentID)
			a.index(st, dimChannel, st.ChannelID)
		}
		// A held call was indexed when it was held, at that time (index):
		// only its new state is.
		a.index(st, dimState, StateDispatched)
		if fromLedger && st.ReportedSeq == 0 {
			a.set(openKey(st), openValue(st, cmd.Payload.DeadlineUnixMS))
		}
	}
	// A repeated command for a dispatched call (a dispatch retried after the
	// duplicate window) leaves the first dispatch as the call's.
	a.saveState(st, ev.seq)
	a.trace(ev, sub.Project, id.AgentTurnID, id.ToolCallID)
	return nil
}

// openKey is the open row of a dispatched call: its tool name, then its
// dispatch time and sequence, so one tool's waiting calls are one range of
// keys, oldest first (open.go).
func openKey(st *CallState) []byte {
	var t time.Time
	if st.DispatchedAt != nil {
		t = *st.DispatchedAt
	}
	return key(tagOpen, st.ToolName).t(t).u64(st.DispatchedSeq)
}

// openValue is the value of a dispatched call's open row: its deadline,
// then the sequence its tool's registration is judged at and its project
// (callTool). The sequence is the held entry's for a held call (the ledger
// pins the tool's definition when it holds the call), else the dispatch's.
func openValue(st *CallState, deadlineUnixMS int64) []byte {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 16+len(st.ProjectID)), uint64(deadlineUnixMS))
	return append(binary.BigEndian.AppendUint64(v, pinSeq(st)), st.ProjectID...)
}

// pinSeq is the sequence of the entry the ledger pinned a call's tool
// definition at: its held entry's, else its command's.
func pinSeq(st *CallState) uint64 {
	if st.HeldSeq != 0 {
		return st.HeldSeq
	}
	return st.DispatchedSeq
}

// index writes an ix row for a call, ordered by its listing time.
func (a *applier) index(st *CallState, dim, value string) {
	if dim != dimAll && value == "" {
		return
	}
	t, seq := st.listedAt()
	k := key(tagIndex, st.ProjectID, dim)
	if dim != dimAll {
		k = k.str(value)
	}
	a.set(k.t(t).u64(seq).str(st.AgentTurnID).str(st.ToolCallID), nil)
}

// listedAt is the time and sequence a call is listed at (its ix rows and
// the calls filter's from and to): its held entry's when it was held for
// approval (it had no dispatch then, and keeps its place once released),
// else its dispatch's.
func (st *CallState) listedAt() (time.Time, uint64) {
	var t time.Time
	if st.HeldSeq != 0 {
		if st.HeldAt != nil {
			t = *st.HeldAt
		}
		return t, st.HeldSeq
	}
	if st.DispatchedAt != nil {
		t = *st.DispatchedAt
	}
	return t, st.DispatchedSeq
}

func (a *applier) saveState(st *CallState, seq uint64) {
	st.UpdatedSeq = seq
	b, err := marshalCallState(st)
	if err != nil {
		panic(fmt.Sprintf("projector: encode call state: %v", err))
	}
	a.set(key(tagState, st.ProjectID, st.AgentTurnID, st.ToolCallID).u64(seq), b)
	c := *st
	a.pending[stateKey(st.ProjectID, st.AgentTurnID, st.ToolCallID)] = &c
}

// committed publishes the batch's call states to the store's cache once the
// batch is durable in Pebble.
func (a *applier) committed() {
	a.store.cacheStates(a.pending)
	a.store.projects.add(a.newProjects)
	a.store.noteStories(a.stories)
}

// stateFor loads a call's state for an entry that follows its dispatch. A
// missing state (the ledger never writes one, but an older export might) is
// started empty rather than failing.
func (a *applier) stateFor(project, turn, call string, seq uint64) (*CallState, error) {
	st, err := a.state(project, turn, call)
	if err != nil || st != nil {
		return st, err
	}
	return &CallState{ProjectID: project, AgentTurnID: turn, ToolCallID: call, State: StateDispatched}, nil
}

func (a *applier) report(ev event) error {
	var r protocol.ReportEntry
	if err := decode(ev, &r); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(r.ProjectID) || !protocol.ValidIdentifier(r.AgentTurnID) || !protocol.ValidIdentifier(r.ToolCallID) || !protocol.ValidIdentifier(r.AgentID) {
		return corrupt(ev.seq, "report entry without valid identity")
	}
	st, err := a.stateFor(r.ProjectID, r.AgentTurnID, r.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	if st.DispatchedSeq != 0 && st.ReportedSeq == 0 {
		// The call's wait ends with its first report (a delete of a row
		// that an external command never wrote changes no row).
		a.del(openKey(st))
	}
	t := ev.t
	st.State, st.ReportedSeq, st.ReportedAt = StateReported, ev.seq, &t
	st.Status, st.ToolResultCardID, st.SourceID = r.Status, r.ToolResultCardID, r.SourceID
	st.AfterExecution, st.EffectiveAfterExecution = r.AfterExecution, r.EffectiveAfterExecution
	st.Outcome = r.AttemptOutcome
	if st.ChannelID == "" {
		st.ChannelID, st.AgentID, st.TurnEpoch = r.ChannelID, r.AgentID, r.TurnEpoch
	}
	a.saveState(st, ev.seq)
	a.index(st, dimStatus, r.Status)
	a.index(st, dimState, StateReported)
	in := InboxEntry{
		ReportSeq: ev.seq, ReportedAt: t, ProjectID: r.ProjectID, ChannelID: r.ChannelID, AgentID: r.AgentID,
		AgentTurnID: r.AgentTurnID, TurnEpoch: r.TurnEpoch, ToolCallID: r.ToolCallID, StepID: r.StepID,
		Status: r.Status, AfterExecution: r.AfterExecution, EffectiveAfterExecution: r.EffectiveAfterExecution,
		ToolResultCardID: r.ToolResultCardID, ToolCallCardID: r.ToolCallCardID, ToolName: r.ToolName, SourceID: r.SourceID,
	}
	b, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encode inbox entry: %w", err)
	}
	a.set(key(tagInbox, r.ProjectID, r.AgentID).u64(ev.seq), b)
	a.set(key(tagPending, r.ProjectID, r.AgentID).u64(ev.seq), nil)
	a.trace(ev, r.ProjectID, r.AgentTurnID, r.ToolCallID)
	return nil
}

func (a *applier) duplicate(ev event) error {
	var d protocol.DuplicateEntry
	if err := decode(ev, &d); err != nil {
		return err
	}
	st, err := a.stateFor(d.ProjectID, d.AgentTurnID, d.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	st.Duplicates++
	a.saveState(st, ev.seq)
	a.trace(ev, d.ProjectID, d.AgentTurnID, d.ToolCallID)
	return nil
}

func (a *applier) wakeup(ev event) error {
	var w protocol.WakeupEntry
	if err := decode(ev, &w); err != nil {
		return err
	}
	st, err := a.stateFor(w.ProjectID, w.AgentTurnID, w.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	if st.WakeupSeq == 0 && w.Phase == "" {
		// A prepared call's wakeup asks for a decision: the call's wakeup
		// is its result's.
		st.WakeupSeq, st.WorkerTarget = ev.seq, w.WorkerTarget
		a.saveState(st, ev.seq)
	}
	a.trace(ev, w.ProjectID, w.AgentTurnID, w.ToolCallID)
	return nil
}

func (a *applier) wakeupSkipped(ev event) error {
	var w protocol.WakeupSkippedEntry
	if err := decode(ev, &w); err != nil {
		return err
	}
	st, err := a.stateFor(w.ProjectID, w.AgentTurnID, w.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	st.WakeupSkipped = true
	a.saveState(st, ev.seq)
	a.trace(ev, w.ProjectID, w.AgentTurnID, w.ToolCallID)
	return nil
}

func (a *applier) consumed(ev event) error {
	var c protocol.ConsumedEntry
	if err := decode(ev, &c); err != nil {
		return err
	}
	st, err := a.stateFor(c.ProjectID, c.AgentTurnID, c.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	t := ev.t
	st.State, st.ConsumedSeq, st.ConsumedAt = StateConsumed, ev.seq, &t
	a.saveState(st, ev.seq)
	a.index(st, dimState, StateConsumed)
	v := binary.BigEndian.AppendUint64(nil, ev.seq)
	v = binary.BigEndian.AppendUint64(v, uint64(t.UnixNano()))
	a.set(key(tagConsumed, c.ProjectID, c.AgentID).u64(c.ReportSeq), v)
	a.del(key(tagPending, c.ProjectID, c.AgentID).u64(c.ReportSeq))
	a.trace(ev, c.ProjectID, c.AgentTurnID, c.ToolCallID)
	return nil
}

func (a *applier) rejection(ev event) error {
	var r protocol.RejectionEntry
	if err := decode(ev, &r); err != nil {
		return err
	}
	project := ev.h.Get(protocol.HeaderProjectID)
	rh := nats.Header(r.Request.Headers)
	// The refused request's headers are as the client sent them: any case.
	turn, call := protocol.HeaderGet(rh, protocol.HeaderAgentTurnID), protocol.HeaderGet(rh, protocol.HeaderToolCallID)
	if turn == "" || call == "" {
		// Body-addressed requests (inbox.consume) name the call in the body.
		var body struct {
			ProjectID   string `json:"project_id"`
			AgentTurnID string `json:"agent_turn_id"`
			ToolCallID  string `json:"tool_call_id"`
		}
		if len(r.Request.Data) > 0 && json.Unmarshal(r.Request.Data, &body) == nil {
			// The body fills what the headers left out, never the reverse:
			// a dispatch naming its turn in headers has a body without one.
			turn, call = cmp.Or(turn, body.AgentTurnID), cmp.Or(call, body.ToolCallID)
			if project == "" {
				project = body.ProjectID
			}
		}
	}
	if !protocol.ValidIdentifier(project) {
		project = protocol.Unrouted
	}
	a.set(key(tagReject, project).u64(ev.seq), []byte(r.Code))
	if project == protocol.Unrouted || !protocol.ValidIdentifier(turn) || !protocol.ValidIdentifier(call) {
		a.trace(ev, project, turn, call)
		return nil
	}
	st, err := a.state(project, turn, call)
	if err != nil {
		return err
	}
	if st == nil {
		if r.Op != protocol.OpDispatch {
			a.trace(ev, project, turn, call)
			return nil
		}
		st = &CallState{ProjectID: project, AgentTurnID: turn, ToolCallID: call, State: StateRejected,
			ChannelID: ev.h.Get(protocol.HeaderChannelID), AgentID: protocol.HeaderGet(rh, protocol.HeaderAgentID)}
		// The refused dispatch's epoch, when it sent a valid one.
		if epoch, err := strconv.ParseUint(protocol.HeaderGet(rh, protocol.HeaderTurnEpoch), 10, 64); err == nil {
			st.TurnEpoch = epoch
		}
		a.index(st, dimState, StateRejected)
	}
	st.Rejections++
	st.LastRejection = string(r.Code)
	if st.RejectedSeq == 0 {
		st.RejectedSeq = ev.seq
	}
	a.saveState(st, ev.seq)
	a.trace(ev, project, turn, call)
	return nil
}

func (a *applier) roster(ev event) error {
	var r protocol.RosterEntry
	if err := decode(ev, &r); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(r.ProjectID) || !protocol.ValidIdentifier(r.AgentID) {
		return corrupt(ev.seq, "roster entry without valid project_id/agent_id")
	}
	a.set(key(tagRoster, r.ProjectID, r.AgentID).u64(ev.seq), []byte(r.WorkerTarget))
	return nil
}

func (a *applier) cancel(ev event) error {
	var c protocol.CancelEntry
	if err := decode(ev, &c); err != nil {
		return err
	}
	st, err := a.stateFor(c.ProjectID, c.AgentTurnID, c.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	st.CancelRequestedSeq = ev.seq
	a.saveState(st, ev.seq)
	a.trace(ev, c.ProjectID, c.AgentTurnID, c.ToolCallID)
	return nil
}

// resolution records an operator's resolution of an outcome_unknown call
// in its state and timeline; the call's report and status stay as they are.
func (a *applier) resolution(ev event) error {
	var e protocol.ResolutionEntry
	if err := decode(ev, &e); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(e.ProjectID) || !protocol.ValidIdentifier(e.AgentTurnID) || !protocol.ValidIdentifier(e.ToolCallID) ||
		(e.Effect != protocol.EffectApplied && e.Effect != protocol.EffectNotApplied) {
		return corrupt(ev.seq, "resolution entry without valid identity or effect")
	}
	st, err := a.stateFor(e.ProjectID, e.AgentTurnID, e.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	st.Resolution, st.ResolutionSeq = e.Effect, ev.seq
	a.saveState(st, ev.seq)
	a.trace(ev, e.ProjectID, e.AgentTurnID, e.ToolCallID)
	return nil
}

// redrive records an operator's redrive of a failed or timed-out call in
// its state and timeline; the call's report and status stay as they are,
// and the derived call has a story of its own from its dispatch.
func (a *applier) redrive(ev event) error {
	var e protocol.RedriveEntry
	if err := decode(ev, &e); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(e.ProjectID) || !protocol.ValidIdentifier(e.AgentTurnID) || !protocol.ValidIdentifier(e.ToolCallID) || !protocol.ValidIdentifier(e.RedriveCallID) {
		return corrupt(ev.seq, "redrive entry without valid identity or derived call")
	}
	st, err := a.stateFor(e.ProjectID, e.AgentTurnID, e.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	st.RedriveCallID, st.RedriveSeq = e.RedriveCallID, ev.seq
	a.saveState(st, ev.seq)
	a.trace(ev, e.ProjectID, e.AgentTurnID, e.ToolCallID)
	return nil
}

// attempt records an attempt of a side_effectful tool in its call's state
// and timeline.
func (a *applier) attempt(ev event) error {
	var e protocol.AttemptEntry
	if err := decode(ev, &e); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(e.ProjectID) || !protocol.ValidIdentifier(e.AgentTurnID) || !protocol.ValidIdentifier(e.ToolCallID) || e.Attempt == 0 {
		return corrupt(ev.seq, "attempt entry without valid identity or attempt number")
	}
	st, err := a.stateFor(e.ProjectID, e.AgentTurnID, e.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	st.Attempt, st.AttemptSeq = e.Attempt, ev.seq
	a.saveState(st, ev.seq)
	a.trace(ev, e.ProjectID, e.AgentTurnID, e.ToolCallID)
	return nil
}

// twoPhase places a prepared or decision entry in its call's timeline.
func (a *applier) twoPhase(ev event) error {
	var e struct {
		ProjectID   string `json:"project_id"`
		AgentTurnID string `json:"agent_turn_id"`
		ToolCallID  string `json:"tool_call_id"`
	}
	if err := decode(ev, &e); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(e.ProjectID) || !protocol.ValidIdentifier(e.AgentTurnID) || !protocol.ValidIdentifier(e.ToolCallID) {
		return corrupt(ev.seq, "%s entry without valid identity", ev.kind)
	}
	a.trace(ev, e.ProjectID, e.AgentTurnID, e.ToolCallID)
	return nil
}

func (a *applier) tool(ev event) error {
	var d protocol.ToolDefinition
	if err := decode(ev, &d); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(d.ProjectID) || !protocol.ValidIdentifier(d.ToolName) {
		return corrupt(ev.seq, "tool entry without valid project_id/tool_name")
	}
	a.set(key(tagTool, d.ProjectID, d.ToolName).u64(ev.seq), ev.data)
	return nil
}

// loadState returns a call's newest state version at or before seq, or nil.
// A call has a handful of versions: they are read forward within the
// call's group (scanGroup), which its bloom filters find.
func loadState(r reader, project, turn, call string, seq uint64) (*CallState, error) {
	var last []byte
	err := scanGroup(r, key(tagState, project, turn, call).prefix(), func(k, v []byte) (bool, error) {
		if trailingU64(k) > seq {
			return false, nil
		}
		last = append(last[:0], v...)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("call state %s/%s: %w", turn, call, err)
	}
	if last == nil {
		return nil, nil
	}
	var st CallState
	if err := json.Unmarshal(last, &st); err != nil {
		return nil, fmt.Errorf("decode call state %s/%s: %w", turn, call, err)
	}
	return &st, nil
}
