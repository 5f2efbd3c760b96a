package projector

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// ApprovalItem is a held call as the approval views show it
// (protocol.ApprovalItem: approval.list and approval.get answer the same).
type ApprovalItem = protocol.ApprovalItem

// approvalDecision is the value of an apd row after its 8-byte sequence:
// what the approval entry decided.
type approvalDecision struct {
	Decision      string `json:"decision"`
	Approver      string `json:"approver"`
	Reason        string `json:"reason,omitempty"`
	DecidedUnixMS int64  `json:"decided_unix_ms"`
}

// held applies a held entry: the call is recorded in state
// awaiting_approval (listed from now, in the indexes a dispatch writes),
// and its approval is pending (the ap, apw, apc and apt rows). A second
// held entry for the same call (the ledger appends one per call) is only
// placed in the timeline.
func (a *applier) held(ev event) error {
	var h protocol.HeldEntry
	if err := decode(ev, &h); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(h.ProjectID) || !protocol.ValidIdentifier(h.AgentTurnID) || !protocol.ValidIdentifier(h.ToolCallID) ||
		!protocol.ValidIdentifier(h.AgentID) || !protocol.ValidIdentifier(h.ToolName) {
		return corrupt(ev.seq, "held entry without valid identity or tool name")
	}
	st, err := a.state(h.ProjectID, h.AgentTurnID, h.ToolCallID)
	if err != nil {
		return err
	}
	if h.Reason == protocol.HeldPaused {
		return a.heldPaused(ev, h, st)
	}
	if st != nil && (st.HeldSeq != 0 || st.DispatchedSeq != 0) {
		a.trace(ev, h.ProjectID, h.AgentTurnID, h.ToolCallID)
		return nil
	}
	prev := st
	st = &CallState{ProjectID: h.ProjectID, AgentTurnID: h.AgentTurnID, ToolCallID: h.ToolCallID}
	if prev != nil {
		// Dispatches refused before this one stay counted, as a command's
		// do (command).
		st.Rejections, st.LastRejection, st.RejectedSeq = prev.Rejections, prev.LastRejection, prev.RejectedSeq
	}
	t := ev.t
	st.ChannelID, st.AgentID, st.TurnEpoch, st.StepID = h.ChannelID, h.AgentID, h.TurnEpoch, h.StepID
	st.ToolName, st.Subject, st.ToolCallCardID = h.ToolName, h.CommandSubject, h.ToolCallCardID
	st.State, st.HeldSeq, st.HeldAt = StateAwaitingApproval, ev.seq, &t
	a.index(st, dimAll, "")
	a.index(st, dimTool, st.ToolName)
	a.index(st, dimAgent, st.AgentID)
	a.index(st, dimChannel, st.ChannelID)
	a.index(st, dimState, StateAwaitingApproval)
	a.saveState(st, ev.seq)

	item := ApprovalItem{
		ProjectID: h.ProjectID, ChannelID: h.ChannelID, AgentID: h.AgentID, AgentTurnID: h.AgentTurnID,
		ToolCallID: h.ToolCallID, ToolName: h.ToolName, ToolCallCardID: h.ToolCallCardID,
		ArgumentsDigest: h.ArgumentsDigest, RequestedBy: h.RequestedBy, Approvers: h.Approvers,
		AllowSelfApproval: h.AllowSelfApproval, RequestedAt: t, ExpiresAt: time.UnixMilli(h.ExpiresUnixMS).UTC(),
		State: protocol.ApprovalPending, HeldSeq: ev.seq,
	}
	b, err := json.Marshal(item)
	if err != nil {
		return fmt.Errorf("encode approval item: %w", err)
	}
	a.set(key(tagHeld, h.ProjectID).u64(ev.seq), b)
	a.set(key(tagAwaiting, h.ProjectID).u64(ev.seq), nil)
	a.set(key(tagHeldCall, h.ProjectID, h.AgentTurnID, h.ToolCallID), binary.BigEndian.AppendUint64(nil, ev.seq))
	a.set(awaitingByToolKey(st), []byte(st.ProjectID))
	a.trace(ev, h.ProjectID, h.AgentTurnID, h.ToolCallID)
	return nil
}

// awaitingByToolKey is the apt row of a held call: its tool, then its held
// time and sequence, so one tool's undecided approvals are one range of
// keys, oldest first. Its value is the call's project, for the tool label
// (callTool: registered in the project before the held entry).
func awaitingByToolKey(st *CallState) []byte {
	t, seq := st.listedAt()
	return key(tagAwaitingBy, st.ToolName).t(t).u64(seq)
}

// approval applies an approval entry: the held call's decision. The call
// stays awaiting_approval until what follows the decision (the command of
// an approved call, the report of any other) moves it on; its approval is
// decided from here (the apd row; the apw and apt rows go). Only the first
// decision of a call counts (the ledger appends one); a later one is only
// placed in the timeline.
func (a *applier) approval(ev event) error {
	var d protocol.ApprovalEntry
	if err := decode(ev, &d); err != nil {
		return err
	}
	if !protocol.ValidIdentifier(d.ProjectID) || !protocol.ValidIdentifier(d.AgentTurnID) || !protocol.ValidIdentifier(d.ToolCallID) {
		return corrupt(ev.seq, "approval entry without valid identity")
	}
	switch d.Decision {
	case protocol.ApprovalApproved, protocol.ApprovalDenied, protocol.ApprovalExpired, protocol.ApprovalCanceled:
	default:
		return corrupt(ev.seq, "approval entry with decision %q", protocol.Clip(d.Decision))
	}
	st, err := a.state(d.ProjectID, d.AgentTurnID, d.ToolCallID)
	if err != nil {
		return err
	}
	if st == nil || st.HeldSeq == 0 || st.ApprovalSeq != 0 {
		// No held call to decide (the ledger appends a decision only for
		// one), or decided already.
		a.trace(ev, d.ProjectID, d.AgentTurnID, d.ToolCallID)
		return nil
	}
	st.Approval, st.ApprovalSeq = d.Decision, ev.seq
	a.saveState(st, ev.seq)
	b, err := json.Marshal(approvalDecision{Decision: d.Decision, Approver: d.Approver, Reason: d.Reason, DecidedUnixMS: d.DecidedUnixMS})
	if err != nil {
		return fmt.Errorf("encode approval decision: %w", err)
	}
	a.set(key(tagDecided, d.ProjectID).u64(st.HeldSeq), append(binary.BigEndian.AppendUint64(nil, ev.seq), b...))
	a.del(key(tagAwaiting, d.ProjectID).u64(st.HeldSeq))
	a.del(awaitingByToolKey(st))
	a.trace(ev, d.ProjectID, d.AgentTurnID, d.ToolCallID)
	return nil
}

// Approvals lists a project's held calls as of the query, in the order
// they were held (oldest first): state is pending (undecided as of the
// query), decided, or all ("" is pending). Each item carries its card's
// arguments.
func (q *Queries) Approvals(project, state string, at AsOf, cursor string, limit int) (*Page[ApprovalItem], error) {
	vs := IDViolations("project_id", project)
	if state == "" {
		state = protocol.ApprovalPending
	}
	if !ValidApprovalState(state) {
		vs.Add("state", protocol.VInvalidValue, "must be pending, decided or all, got %q", protocol.Clip(state))
	}
	if len(vs) > 0 {
		return nil, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid approvals query", Violations: vs}
	}
	after, err := decodeSeqCursor(cursor, approvalsScope(project, state))
	if err != nil {
		return nil, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, err
	}
	defer v.close()
	limit = clampLimit(limit)
	out := &Page[ApprovalItem]{AsOfSeq: v.seq, Items: []ApprovalItem{}}
	// The walk: undecided calls now are exactly the apw rows; decided ones
	// the apd rows (checked against the query's sequence); anything else
	// walks every held call.
	var walk []byte
	switch {
	case state == protocol.ApprovalPending && v.seq == v.applied:
		walk = key(tagAwaiting, project).prefix()
	case state == protocol.ApprovalListDecided:
		walk = key(tagDecided, project).prefix()
	default:
		walk = key(tagHeld, project).prefix()
	}
	held, err := newSeeker(v.snap, key(tagHeld, project).prefix())
	if err != nil {
		return nil, fmt.Errorf("projector: approvals: %w", err)
	}
	defer held.close()
	decided, err := newSeeker(v.snap, key(tagDecided, project).prefix())
	if err != nil {
		return nil, fmt.Errorf("projector: approvals: %w", err)
	}
	defer decided.close()
	lower := append(append([]byte(nil), walk...), binary.BigEndian.AppendUint64(nil, after+1)...)
	// A walk that filters (pending or decided as of an earlier sequence)
	// examines at most maxExamined held calls a page, as a calls listing
	// does: a page can then be short, with a cursor to continue.
	examined, last := 0, uint64(0)
	err = scan(v.snap, walk, lower, func(k, _ []byte) (bool, error) {
		seq := trailingU64(k)
		if seq > v.seq {
			return false, nil
		}
		if len(out.Items) == limit || examined == maxExamined {
			out.NextCursor = encodeSeqCursor(approvalsScope(project, state), last)
			return false, nil
		}
		examined, last = examined+1, seq
		item, err := v.heldCall(project, seq, held, decided)
		if err != nil {
			return false, err
		}
		if state != protocol.ApprovalListAll && (state == protocol.ApprovalPending) != (item.State == protocol.ApprovalPending) {
			return true, nil
		}
		if item.Arguments, err = v.cardArguments(project, item.ToolCallCardID, seq); err != nil {
			return false, err
		}
		out.Items = append(out.Items, item)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: approvals: %w", err)
	}
	return out, nil
}

// Approval answers one held call as of the query; not_found when the call
// was not held (or not yet, as of the query).
func (q *Queries) Approval(project, turn, call string, at AsOf) (*ApprovalItem, uint64, error) {
	if err := checkIDs("project_id", project, "agent_turn_id", turn, "tool_call_id", call); err != nil {
		return nil, 0, err
	}
	v, err := q.open(at)
	if err != nil {
		return nil, 0, err
	}
	defer v.close()
	raw, ok, err := get(v.snap, key(tagHeldCall, project, turn, call))
	if err != nil {
		return nil, 0, fmt.Errorf("projector: approval %s/%s: %w", turn, call, err)
	}
	if !ok || len(raw) != 8 || binary.BigEndian.Uint64(raw) > v.seq {
		return nil, v.seq, notFound("no call %s of turn %s was held for approval (as of seq %d)", call, turn, v.seq)
	}
	held, err := newSeeker(v.snap, key(tagHeld, project).prefix())
	if err != nil {
		return nil, 0, fmt.Errorf("projector: approval: %w", err)
	}
	defer held.close()
	decided, err := newSeeker(v.snap, key(tagDecided, project).prefix())
	if err != nil {
		return nil, 0, fmt.Errorf("projector: approval: %w", err)
	}
	defer decided.close()
	item, err := v.approvalItem(project, binary.BigEndian.Uint64(raw), held, decided)
	if err != nil {
		return nil, 0, fmt.Errorf("projector: approval %s/%s: %w", turn, call, err)
	}
	return &item, v.seq, nil
}

// approvalItem reads the held call of held entry seq as of the view
// (heldCall) with its card's arguments.
func (v *view) approvalItem(project string, seq uint64, held, decided *seeker) (ApprovalItem, error) {
	item, err := v.heldCall(project, seq, held, decided)
	if err != nil {
		return item, err
	}
	item.Arguments, err = v.cardArguments(project, item.ToolCallCardID, seq)
	return item, err
}

// heldCall reads the held call of held entry seq as of the view: its ap
// row, and its decision when the apd row was written by then.
func (v *view) heldCall(project string, seq uint64, held, decided *seeker) (ApprovalItem, error) {
	var item ApprovalItem
	raw, ok, err := held.get(key(tagHeld, project).u64(seq))
	if err != nil || !ok {
		return item, fmt.Errorf("held call %d not stored: %v", seq, err)
	}
	if err := json.Unmarshal(raw, &item); err != nil {
		return item, fmt.Errorf("decode held call %d: %w", seq, err)
	}
	d, ok, err := decided.get(key(tagDecided, project).u64(seq))
	if err != nil {
		return item, err
	}
	if ok && len(d) > 8 && binary.BigEndian.Uint64(d) <= v.seq {
		var dec approvalDecision
		if err := json.Unmarshal(d[8:], &dec); err != nil {
			return item, fmt.Errorf("decode decision of held call %d: %w", seq, err)
		}
		t := time.UnixMilli(dec.DecidedUnixMS).UTC()
		item.State, item.Approver, item.Reason, item.DecidedAt = dec.Decision, dec.Approver, dec.Reason, &t
		item.DecisionSeq = binary.BigEndian.Uint64(d)
	}
	return item, nil
}

// cardArguments returns content.arguments of the newest version of a card
// at or before seq (nil when the views hold none).
func (v *view) cardArguments(project, cardID string, seq uint64) (json.RawMessage, error) {
	if !protocol.ValidIdentifier(cardID) {
		return nil, nil
	}
	var last []byte
	err := scanGroup(v.snap, key(tagCard, project, cardID).prefix(), func(k, val []byte) (bool, error) {
		if trailingU64(k) > seq {
			return false, nil
		}
		last = append(last[:0], val...)
		return true, nil
	})
	if err != nil || last == nil {
		return nil, err
	}
	_, data, err := decodeCardRow(last)
	if err != nil {
		return nil, err
	}
	var c struct {
		Content struct {
			Arguments json.RawMessage `json:"arguments"`
		} `json:"content"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("decode card %s: %w", cardID, err)
	}
	return c.Content.Arguments, nil
}

// ValidApprovalState reports whether s is an approvals listing's state
// (pending, decided or all).
func ValidApprovalState(s string) bool {
	switch s {
	case protocol.ApprovalPending, protocol.ApprovalListDecided, protocol.ApprovalListAll:
		return true
	}
	return false
}

// approvalsScope is the scope of an approvals page's cursor.
func approvalsScope(project, state string) string {
	if state == "" {
		state = protocol.ApprovalPending
	}
	return "approvals\x00" + project + "\x00" + state
}

// ApprovalsCursor checks cursors of an approvals listing.
func ApprovalsCursor(project, state string) CursorCheck {
	return seqCursor(approvalsScope(project, state))
}

// PendingApprovals are one tool's undecided approvals.
type PendingApprovals struct {
	Pending int
	// OldestHeld is the held time of the oldest (zero when none).
	OldestHeld time.Time
}

// PendingApprovals counts the undecided approvals per tool as the views
// have applied the ledger: one iterator over the apt rows, one per
// undecided held call (the cost grows with the calls waiting for a
// decision, never with the ledger's length), and a read of the tool rows
// per project and tool among them (CallTool).
func (s *Store) PendingApprovals() (map[CallTool]PendingApprovals, error) {
	out := map[CallTool]PendingApprovals{}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	reg := registrations{r: snap}
	p := key(tagAwaitingBy).prefix()
	const tail = 1 + 8 + 1 + 8
	err := scan(snap, p, nil, func(k, v []byte) (bool, error) {
		if len(k) < len(p)+tail {
			return false, fmt.Errorf("malformed apt row %q", k)
		}
		name := string(k[len(p) : len(k)-tail])
		registered, err := reg.before(string(v), name, trailingU64(k))
		if err != nil {
			return false, err
		}
		tool := CallTool{Name: name, Registered: registered}
		held := time.Unix(0, int64(binary.BigEndian.Uint64(k[len(k)-tail+1:len(k)-tail+9]))).UTC()
		w := out[tool]
		// Rows of one tool are in held order: its first is its oldest.
		if w.Pending == 0 {
			w.OldestHeld = held
		}
		w.Pending++
		out[tool] = w
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: pending approvals: %w", err)
	}
	return out, nil
}
