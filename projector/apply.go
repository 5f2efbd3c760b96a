package projector

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/ledger"
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
	Head      ledger.Link
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

// ErrCorruptEntry marks an entry the projector cannot apply. The projector
// stops there; it never skips an entry.
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
}

func newApplier(s *Store, cp checkpoint) *applier {
	return &applier{b: s.db.NewBatch(), cp: cp, store: s, pending: map[string]*CallState{}}
}

func stateKey(project, turn, call string) string { return project + "\x00" + turn + "\x00" + call }

// state returns a copy of a call's newest state, or nil.
func (a *applier) state(project, turn, call string) (*CallState, error) {
	k := stateKey(project, turn, call)
	if st, ok := a.pending[k]; ok {
		c := *st
		return &c, nil
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

// apply folds entry e (which must be cp.Applied+1) into the batch and
// advances the checkpoint.
func (a *applier) apply(e ledger.Entry) error {
	if e.Seq != a.cp.Applied+1 {
		return fmt.Errorf("%w: expected seq %d, got %d", ErrGap, a.cp.Applied+1, e.Seq)
	}
	h := nats.Header(e.Headers)
	kind := h.Get(ledger.HeaderEntryKind)
	if kind == "" {
		kind = "external"
		if sub, err := ledger.ParseSubject(e.Subject); err == nil {
			switch {
			case sub.IsCommand():
				kind = string(ledger.KindCommand)
			case sub.Kind == ledger.SubjectWakeup:
				kind = "external_wakeup"
			}
		}
	}
	// Entries without CG-Time (published by others) get no time: their
	// stream timestamp would differ in a replay.
	t, _ := ledger.EntryTime(h)
	if t.After(a.cp.Watermark) {
		a.cp.Watermark = t
	}
	a.cp.Head = ledger.NextLink(a.cp.Head, e.Seq, e.Subject, h, e.Data)
	a.cp.Applied = e.Seq
	// Only the chained headers are kept: JetStream's own (Nats-*) steer the
	// server and differ when the same entries are replayed elsewhere.
	a.set(key(tagEntry).u64(e.Seq), encodeEntry(storedEntry{Subject: e.Subject, Kind: kind, Headers: ledger.ChainedHeaders(e.Headers), Data: e.Data, Time: t}))
	a.set(key(tagLink).u64(e.Seq), a.cp.Head[:])
	a.set(key(tagTime).t(a.cp.Watermark).u64(e.Seq), nil)

	var err error
	ev := event{seq: e.Seq, t: t, kind: kind, h: h, data: e.Data, subject: e.Subject}
	switch ledger.EntryKind(kind) {
	case ledger.KindCard:
		err = a.card(ev)
	case ledger.KindCommand:
		err = a.command(ev, h.Get(ledger.HeaderEntryKind) != "")
	case ledger.KindReport:
		err = a.report(ev)
	case ledger.KindDuplicate:
		err = a.duplicate(ev)
	case ledger.KindWakeup:
		err = a.wakeup(ev)
	case ledger.KindWakeupSkipped:
		err = a.wakeupSkipped(ev)
	case ledger.KindConsumed:
		err = a.consumed(ev)
	case ledger.KindRejection:
		err = a.rejection(ev)
	case ledger.KindRoster:
		err = a.roster(ev)
	case ledger.KindTool:
		err = a.tool(ev)
	case ledger.KindCancel:
		err = a.cancel(ev)
	case "external", "external_wakeup":
	default:
		err = corrupt(e.Seq, "unknown entry kind %q", kind)
	}
	if err != nil {
		return err
	}
	a.set(metaApplied, a.cp.encode())
	return nil
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

// trace indexes the entry in the turn timeline and the call story.
func (a *applier) trace(ev event, project, turn, call string) {
	if !ledger.ValidIdentifier(project) || !ledger.ValidIdentifier(turn) {
		return
	}
	a.set(key(tagTimeline, project, turn).u64(ev.seq), []byte(ev.kind))
	if ledger.ValidIdentifier(call) {
		a.set(key(tagStory, project, call, turn).u64(ev.seq), []byte(ev.kind))
	}
}

func (a *applier) card(ev event) error {
	var c ledger.Card
	if err := decode(ev, &c); err != nil {
		return err
	}
	if !ledger.ValidIdentifier(c.ProjectID) || !ledger.ValidIdentifier(c.CardID) {
		return corrupt(ev.seq, "card entry without valid project_id/card_id")
	}
	a.set(key(tagCard, c.ProjectID, c.CardID).u64(ev.seq), ev.data)
	if ledger.ValidIdentifier(c.AgentTurnID) {
		a.set(key(tagTurnCard, c.ProjectID, c.AgentTurnID).u64(ev.seq), []byte(c.CardID))
	}
	a.trace(ev, c.ProjectID, c.AgentTurnID, c.ToolCallID)
	return nil
}

func (a *applier) command(ev event, fromLedger bool) error {
	cmd, err := ledger.ParseToolCommand(ev.subject, ev.h, ev.data)
	if err != nil {
		if fromLedger {
			return corrupt(ev.seq, "command written by the ledger does not validate: %v", err)
		}
		// An external publish on a command subject that does not follow the
		// protocol: keep it in the timeline if it names a turn.
		sub, _ := ledger.ParseSubject(ev.subject)
		id, _ := ledger.ParseIdentity(ev.h, ledger.IdentityRules{})
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
		a.index(st, dimAll, "")
		a.index(st, dimTool, st.ToolName)
		a.index(st, dimAgent, st.AgentID)
		a.index(st, dimChannel, st.ChannelID)
		a.index(st, dimState, StateDispatched)
	}
	// A repeated command for a dispatched call (a dispatch retried after the
	// duplicate window) leaves the first dispatch as the call's.
	a.saveState(st, ev.seq)
	a.trace(ev, sub.Project, id.AgentTurnID, id.ToolCallID)
	return nil
}

// index writes an ix row for a call, ordered by dispatch time.
func (a *applier) index(st *CallState, dim, value string) {
	if dim != dimAll && value == "" {
		return
	}
	var t time.Time
	if st.DispatchedAt != nil {
		t = *st.DispatchedAt
	}
	k := key(tagIndex, st.ProjectID, dim)
	if dim != dimAll {
		k = k.str(value)
	}
	a.set(k.t(t).u64(st.DispatchedSeq).str(st.AgentTurnID).str(st.ToolCallID), nil)
}

func (a *applier) saveState(st *CallState, seq uint64) {
	st.UpdatedSeq = seq
	b, err := json.Marshal(st)
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
	var r ledger.ReportEntry
	if err := decode(ev, &r); err != nil {
		return err
	}
	if !ledger.ValidIdentifier(r.ProjectID) || !ledger.ValidIdentifier(r.AgentTurnID) || !ledger.ValidIdentifier(r.ToolCallID) || !ledger.ValidIdentifier(r.AgentID) {
		return corrupt(ev.seq, "report entry without valid identity")
	}
	st, err := a.stateFor(r.ProjectID, r.AgentTurnID, r.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	t := ev.t
	st.State, st.ReportedSeq, st.ReportedAt = StateReported, ev.seq, &t
	st.Status, st.ToolResultCardID, st.SourceID = r.Status, r.ToolResultCardID, r.SourceID
	st.AfterExecution, st.EffectiveAfterExecution = r.AfterExecution, r.EffectiveAfterExecution
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
	var d ledger.DuplicateEntry
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
	var w ledger.WakeupEntry
	if err := decode(ev, &w); err != nil {
		return err
	}
	st, err := a.stateFor(w.ProjectID, w.AgentTurnID, w.ToolCallID, ev.seq)
	if err != nil {
		return err
	}
	if st.WakeupSeq == 0 {
		st.WakeupSeq, st.WorkerTarget = ev.seq, w.WorkerTarget
		a.saveState(st, ev.seq)
	}
	a.trace(ev, w.ProjectID, w.AgentTurnID, w.ToolCallID)
	return nil
}

func (a *applier) wakeupSkipped(ev event) error {
	var w ledger.WakeupSkippedEntry
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
	var c ledger.ConsumedEntry
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
	var r ledger.RejectionEntry
	if err := decode(ev, &r); err != nil {
		return err
	}
	project := ev.h.Get(ledger.HeaderProjectID)
	rh := nats.Header(r.Request.Headers)
	// The refused request's headers are as the client sent them: any case.
	turn, call := ledger.HeaderGet(rh, ledger.HeaderAgentTurnID), ledger.HeaderGet(rh, ledger.HeaderToolCallID)
	if turn == "" || call == "" {
		// Body-addressed requests (inbox.consume) name the call in the body.
		var body struct {
			ProjectID   string `json:"project_id"`
			AgentTurnID string `json:"agent_turn_id"`
			ToolCallID  string `json:"tool_call_id"`
		}
		if len(r.Request.Data) > 0 && json.Unmarshal(r.Request.Data, &body) == nil {
			turn, call = body.AgentTurnID, body.ToolCallID
			if project == "" {
				project = body.ProjectID
			}
		}
	}
	if !ledger.ValidIdentifier(project) {
		project = ledger.Unrouted
	}
	a.set(key(tagReject, project).u64(ev.seq), []byte(r.Code))
	if project == ledger.Unrouted || !ledger.ValidIdentifier(turn) || !ledger.ValidIdentifier(call) {
		a.trace(ev, project, turn, call)
		return nil
	}
	st, err := a.state(project, turn, call)
	if err != nil {
		return err
	}
	if st == nil {
		if r.Op != ledger.OpDispatch {
			a.trace(ev, project, turn, call)
			return nil
		}
		st = &CallState{ProjectID: project, AgentTurnID: turn, ToolCallID: call, State: StateRejected,
			ChannelID: ev.h.Get(ledger.HeaderChannelID), AgentID: ledger.HeaderGet(rh, ledger.HeaderAgentID)}
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
	var r ledger.RosterEntry
	if err := decode(ev, &r); err != nil {
		return err
	}
	if !ledger.ValidIdentifier(r.ProjectID) || !ledger.ValidIdentifier(r.AgentID) {
		return corrupt(ev.seq, "roster entry without valid project_id/agent_id")
	}
	a.set(key(tagRoster, r.ProjectID, r.AgentID).u64(ev.seq), []byte(r.WorkerTarget))
	return nil
}

func (a *applier) cancel(ev event) error {
	var c ledger.CancelEntry
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

func (a *applier) tool(ev event) error {
	var d ledger.ToolDefinition
	if err := decode(ev, &d); err != nil {
		return err
	}
	if !ledger.ValidIdentifier(d.ProjectID) || !ledger.ValidIdentifier(d.ToolName) {
		return corrupt(ev.seq, "tool entry without valid project_id/tool_name")
	}
	a.set(key(tagTool, d.ProjectID, d.ToolName).u64(ev.seq), ev.data)
	return nil
}

// loadState returns a call's newest state version at or before seq, or nil.
func loadState(r reader, project, turn, call string, seq uint64) (*CallState, error) {
	p := key(tagState, project, turn, call).prefix()
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: key(tagState, project, turn, call).u64(seq + 1)})
	if err != nil {
		return nil, fmt.Errorf("call state iterator: %w", err)
	}
	defer it.Close()
	if !it.Last() {
		return nil, it.Error()
	}
	var st CallState
	if err := json.Unmarshal(it.Value(), &st); err != nil {
		return nil, fmt.Errorf("decode call state %s/%s: %w", turn, call, err)
	}
	return &st, nil
}
