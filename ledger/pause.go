package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// Pausing a tool (docs/operations.md, "Operator actions"). A tool's pause
// state is the last entry on its pause subject. Every command append (a
// dispatch's, an approval's release, a resume's) carries the expectation
// that this subject's last sequence is the one the writer saw, so a pause
// stored between the read and the append makes the append fail, and the
// writer reads again and holds the call instead. A held call's entry (the
// held entry with reason paused, which carries its command) carries the
// same expectation on the pause it saw, so no call is held after the
// resume that should release it: a resume releases exactly the held
// entries of its tool between its pause and itself.

// pauseState is a tool's pause state: the last entry on its pause subject.
type pauseState struct {
	// seq is that entry's sequence, 0 when the tool was never paused.
	seq    uint64
	paused bool
	entry  protocol.ToolPauseEntry
}

// pauseKey keys a tool's state in Ledger.pauses.
func pauseKey(project, tool string) string { return project + "\x00" + tool }

// pauseOf reads a tool's pause state. cached may answer from memory: only
// as a first guess for a write whose expectation checks it.
func (l *Ledger) pauseOf(ctx context.Context, project, tool string, cached bool) (pauseState, error) {
	if cached {
		if v, ok := l.pauses.Load(pauseKey(project, tool)); ok {
			return v.(pauseState), nil
		}
	}
	m, err := l.lastForSubject(ctx, protocol.PauseSubject(l.version, project, tool))
	if err != nil {
		return pauseState{}, fmt.Errorf("pause state of tool %s: %w", tool, err)
	}
	var st pauseState
	if m != nil {
		if err := json.Unmarshal(m.Data, &st.entry); err != nil {
			return pauseState{}, fmt.Errorf("pause state of tool %s: decode entry %d: %w", tool, m.Sequence, err)
		}
		st.seq, st.paused = m.Sequence, st.entry.Paused
	}
	l.notePause(project, tool, st)
	return st, nil
}

// notePause keeps st as the tool's state unless a newer one is known.
func (l *Ledger) notePause(project, tool string, st pauseState) {
	k := pauseKey(project, tool)
	for range 16 {
		old, loaded := l.pauses.LoadOrStore(k, st)
		if !loaded || old.(pauseState).seq >= st.seq || l.pauses.CompareAndSwap(k, old, st) {
			break
		}
	}
	if st.seq == 0 {
		return
	}
	v := 0.0
	if cur, ok := l.pauses.Load(k); ok && cur.(pauseState).paused {
		v = 1
	}
	l.m.toolPaused.WithLabelValues(l.labels.Label(tool)).Set(v)
}

// commandOrHold appends a call's command (msg, its deadline set) unless
// the call's tool is paused, in which case it appends the call's held
// entry (reason paused) instead. Exactly one of ack and held is set. The
// call record is the caller's to update.
func (l *Ledger) commandOrHold(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord, msg *nats.Msg, deadline int64) (ack *jetstream.PubAck, held *protocol.PausedCall, err error) {
	pauseSubj := protocol.PauseSubject(l.version, rec.ProjectID, rec.ToolName)
	st, err := l.pauseOf(ctx, rec.ProjectID, rec.ToolName, true)
	if err != nil {
		return nil, nil, err
	}
	for range 16 {
		if !st.paused {
			if err := l.resumeFinished(ctx, rec.ProjectID, rec.ToolName, st); err != nil {
				return nil, nil, err
			}
			ack, err := l.appendEntry(ctx, by, protocol.KindCommand, msg, jetstream.WithExpectLastSequenceForSubject(st.seq, pauseSubj))
			if err == nil {
				return ack, nil, nil
			}
			if !isWrongLastSeq(err) {
				return nil, nil, err
			}
		} else {
			seq, ok, err := l.appendPausedHeld(ctx, rec, msg, deadline, st.seq)
			if err != nil {
				return nil, nil, err
			}
			if ok {
				if err := l.step(stepPauseHeld); err != nil {
					return nil, nil, err
				}
				return nil, &protocol.PausedCall{Header: cloneHeader(msg.Header), Payload: slices.Clone(msg.Data), PauseSeq: st.seq, HeldSeq: seq}, nil
			}
		}
		// The tool's state changed since it was read: read it again.
		if st, err = l.pauseOf(ctx, rec.ProjectID, rec.ToolName, false); err != nil {
			return nil, nil, err
		}
	}
	return nil, nil, fmt.Errorf("command of %s/%s: tool %s paused and resumed too often meanwhile", rec.AgentTurnID, rec.ToolCallID, rec.ToolName)
}

// cloneHeader copies the command's headers without the ones appendEntry
// and the publish options set, which a release sets again.
func cloneHeader(h nats.Header) map[string][]string {
	out := map[string][]string{}
	for k, v := range h {
		switch k {
		case protocol.HeaderEntryKind, protocol.HeaderTime, protocol.HeaderActor, jetstream.ExpectedLastSubjSeqHeader, jetstream.ExpectedLastSubjSeqSubjHeader, jetstream.ExpectedStreamHeader:
			continue
		}
		out[k] = slices.Clone(v)
	}
	return out
}

// appendPausedHeld appends the held entry of a call whose tool is paused
// (pauseSeq, the pause entry the caller read), carrying its command. It
// expects the pause to be the tool's state still: ok=false when it is not
// (the caller reads it again). A call has one such entry: found, it is
// returned.
func (l *Ledger) appendPausedHeld(ctx context.Context, rec *protocol.CallRecord, cmd *nats.Msg, deadline int64, pauseSeq uint64) (uint64, bool, error) {
	subj := protocol.HeldSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	if e, seq, err := l.pausedHeldOf(ctx, rec); err != nil || e != nil {
		return seq, err == nil, err
	}
	var budget int64
	if rec.Held != nil {
		budget = rec.Held.BudgetMS
	} else if !rec.DispatchedAt.IsZero() {
		budget = deadline - rec.DispatchedAt.UnixMilli()
	}
	e := pausedHeldEntry{
		HeldEntry: protocol.HeldEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID,
			TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, StepID: rec.StepID, ToolName: rec.ToolName, ToolCallCardID: rec.ToolCallCardID,
			Reason: protocol.HeldPaused, CommandSubject: cmd.Subject, BudgetMS: budget, DeadlineUnixMS: deadline, PauseSeq: pauseSeq},
		CommandHeader:  cloneHeader(cmd.Header),
		CommandPayload: cmd.Data,
	}
	if rec.Held != nil {
		e.ArgumentsDigest = rec.Held.ArgumentsDigest
	}
	data, err := json.Marshal(e)
	if err != nil {
		return 0, false, fmt.Errorf("held entry: encode: %w", err)
	}
	msg := &nats.Msg{Subject: subj, Data: data, Header: approvalHeader(rec)}
	msg.Header.Set(protocol.HeaderMsgID, "held.paused."+rec.ProjectID+"."+rec.AgentTurnID+"."+rec.ToolCallID)
	// The ledger's own entry: no caller's actor on it.
	ack, err := l.appendEntry(ctx, nil, protocol.KindHeld, msg,
		jetstream.WithExpectLastSequenceForSubject(pauseSeq, protocol.PauseSubject(l.version, rec.ProjectID, rec.ToolName)))
	switch {
	case err == nil:
		if !ack.Duplicate {
			l.log.Info("call held: its tool is paused", "project", rec.ProjectID, "turn", rec.AgentTurnID, "call", rec.ToolCallID, "tool", rec.ToolName, "pause_seq", pauseSeq, "seq", ack.Sequence)
		}
		return ack.Sequence, true, nil
	case isWrongLastSeq(err):
		return 0, false, nil
	default:
		return 0, false, fmt.Errorf("held entry: append: %w", err)
	}
}

// pausedHeldEntry is a held entry of reason paused as stored: the held
// entry and the command a resume publishes.
type pausedHeldEntry struct {
	protocol.HeldEntry
	CommandHeader  map[string][]string `json:"command_header"`
	CommandPayload json.RawMessage     `json:"command_payload"`
}

// pausedHeldOf reads the call's held entry of reason paused, if any.
func (l *Ledger) pausedHeldOf(ctx context.Context, rec *protocol.CallRecord) (*pausedHeldEntry, uint64, error) {
	m, err := l.lastForSubject(ctx, protocol.HeldSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil || m == nil {
		return nil, 0, err
	}
	var e pausedHeldEntry
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return nil, 0, fmt.Errorf("decode held entry %d: %w", m.Sequence, err)
	}
	if e.Reason != protocol.HeldPaused {
		return nil, 0, nil
	}
	return &e, m.Sequence, nil
}

// holdDispatched moves the record of a call whose dispatch found its tool
// paused (and stored its held entry) from dispatched to paused. A resume
// may have released it first: the record then has its command, returned.
func (l *Ledger) holdDispatched(ctx context.Context, key string, rec *protocol.CallRecord, rev uint64, held *protocol.PausedCall) (*protocol.CallRecord, error) {
	cur := cloneRecord(rec)
	for range 16 {
		if cur.State != protocol.StateDispatched || cur.CommandSeq != 0 || cur.Paused != nil {
			// Moved on; or released: a resume marks the record (Paused
			// set, state dispatched) before it publishes the command.
			return cur, nil
		}
		next := cloneRecord(cur)
		next.State, next.Paused = protocol.StatePaused, held
		if _, ok, err := l.updateRecord(ctx, key, next, rev); err != nil || ok {
			return next, err
		}
		r, nrev, err := l.reread(ctx, key)
		if err != nil {
			return nil, err
		}
		cur, rev = cloneRecord(r), nrev
	}
	return nil, fmt.Errorf("call record %s: too many concurrent updates", key)
}

// dispatchPausedAnswer answers a dispatch of a call held by a pause.
func dispatchPausedAnswer(rec *protocol.CallRecord, cardSeq uint64, duplicate bool) protocol.DispatchResult {
	res := protocol.DispatchResult{Subject: rec.Subject, ToolCallCardID: rec.ToolCallCardID, CardSeq: cardSeq, Duplicate: duplicate,
		ToolDefSeq: rec.ToolDefSeq, ToolVersion: rec.ToolVersion, DeadlineUnixMS: rec.DeadlineUnixMS, CommandSeq: rec.CommandSeq}
	res.Paused = rec.State == protocol.StatePaused
	return res
}

// PauseTool pauses a tool (the tool.pause op) for actor, an admin.
func (l *Ledger) PauseTool(ctx context.Context, actor string, req protocol.ToolPauseRequest) (protocol.ToolPauseResult, error) {
	return l.toolPauseReq(ctx, protocol.OpToolPause, actor, req)
}

// ResumeTool resumes a paused tool (the tool.resume op) for actor, an
// admin, and publishes the commands of its held calls in dispatch order.
func (l *Ledger) ResumeTool(ctx context.Context, actor string, req protocol.ToolPauseRequest) (protocol.ToolPauseResult, error) {
	return l.toolPauseReq(ctx, protocol.OpToolResume, actor, req)
}

// toolPauseReq is PauseTool and ResumeTool: a certainly valid request goes
// to the core as it is; any other takes the API's parser (toolPauseJSON).
func (l *Ledger) toolPauseReq(ctx context.Context, op, actor string, req protocol.ToolPauseRequest) (res protocol.ToolPauseResult, err error) {
	by := atEdge(ctx, req.ProjectID, actor)
	ident := protocol.ValidIdentifier
	if !ident(actor) || !ident(req.ProjectID) || !ident(req.ToolName) || !certainText(req.Reason, protocol.MaxOperatorReasonBytes, true) {
		return viaWire(ctx, op, req, func(ctx context.Context, body []byte) (protocol.ToolPauseResult, error) {
			return l.toolPauseJSON(ctx, by, op, actor, body)
		})
	}
	defer func() { l.countOperatorAction(op, err) }()
	return l.toolPause(ctx, by, op, actor, req, rawOf(req))
}

// ToolPauseOp runs tool.pause or tool.resume (op) for actor, an admin,
// with the request body as received (HTTP's POST
// /projects/{p}/tools/{tool}/pause and /resume): a refusal lists every
// violation and is recorded.
func (l *Ledger) ToolPauseOp(ctx context.Context, op, actor string, body []byte) (protocol.ToolPauseResult, error) {
	if op != protocol.OpToolPause && op != protocol.OpToolResume {
		return protocol.ToolPauseResult{}, fmt.Errorf("ToolPauseOp: %q is not %s or %s", op, protocol.OpToolPause, protocol.OpToolResume)
	}
	p, _ := protocol.TopLevelString(body, "project_id")
	return l.toolPauseJSON(ctx, atEdge(ctx, p, actor), op, actor, body)
}

// toolPauseJSON pauses or resumes a tool, or refuses (and records) the
// request listing every violation: bad_request (the body), not_found (a
// tool neither registered in the project nor built in), conflict (a pause
// of a paused tool, a resume of a running one).
func (l *Ledger) toolPauseJSON(ctx context.Context, by *protocol.Caller, op, actor string, body []byte) (res protocol.ToolPauseResult, err error) {
	defer func() { l.countOperatorAction(op, err) }()
	req, vs := protocol.ParseToolPauseRequest(body)
	raw := rawBody(body)
	if err := l.refuseOperator(ctx, by, op, actor, req.ProjectID, vs, raw); err != nil {
		return res, err
	}
	return l.toolPause(ctx, by, op, actor, req, raw)
}

// toolPause is the one core of tool.pause and tool.resume, typed or
// received: req is valid, actor a valid token, raw the request a refusal
// records.
func (l *Ledger) toolPause(ctx context.Context, by *protocol.Caller, op, actor string, req protocol.ToolPauseRequest, raw func() protocol.RejectedRequest) (res protocol.ToolPauseResult, err error) {
	registered, err := l.registeredTool(ctx, req.ProjectID, req.ToolName)
	if err != nil {
		return res, fmt.Errorf("%s %s: %w", op, req.ToolName, err)
	}
	var missing protocol.Violations
	if registered == nil && l.builtin[req.ToolName] == nil && !slices.Contains(protocol.ReservedToolNames, req.ToolName) {
		missing.Add("body.tool_name", protocol.VNotFound, "no tool %s is registered in project %s, and none is built in", req.ToolName, req.ProjectID)
	}
	pause := op == protocol.OpToolPause
	for range 16 {
		st, err := l.pauseOf(ctx, req.ProjectID, req.ToolName, false)
		if err != nil {
			return res, fmt.Errorf("%s %s: %w", op, req.ToolName, err)
		}
		if !st.paused {
			// A resume cut short (a crash) is finished before anything
			// else: before a new pause, its calls must be out.
			if _, err := l.finishResume(ctx, req.ProjectID, req.ToolName, st); err != nil {
				return res, fmt.Errorf("%s %s: finish the last resume: %w", op, req.ToolName, err)
			}
		}
		all := slices.Clone(missing)
		if st.paused == pause {
			what := "running"
			if st.paused {
				what = fmt.Sprintf("paused since seq %d by %s (%q)", st.seq, st.entry.Actor, st.entry.Reason)
			} else if st.seq != 0 {
				what = fmt.Sprintf("running since seq %d (resumed by %s: %q)", st.seq, st.entry.Actor, st.entry.Reason)
			}
			all.Add("body.tool_name", protocol.VConflict, "tool %s is %s", req.ToolName, what)
		}
		switch {
		case len(missing) > 0:
			return res, l.reject(ctx, by, op, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeNotFound, all, "unknown tool %s", req.ToolName), raw())
		case len(all) > 0:
			return res, l.reject(ctx, by, op, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeConflict, all, "tool %s is already %s", req.ToolName, map[bool]string{true: "paused", false: "running"}[st.paused]), raw())
		}
		e := protocol.ToolPauseEntry{ProjectID: req.ProjectID, ToolName: req.ToolName, Paused: pause, Actor: actor, Reason: req.Reason}
		if !pause {
			e.PauseSeq = st.seq
		}
		data, err := json.Marshal(e)
		if err != nil {
			return res, fmt.Errorf("%s: encode entry: %w", op, err)
		}
		msg := &nats.Msg{Subject: protocol.PauseSubject(l.version, req.ProjectID, req.ToolName), Data: data, Header: nats.Header{}}
		msg.Header.Set(protocol.HeaderProjectID, req.ProjectID)
		ack, err := l.appendEntry(ctx, by, protocol.KindToolPause, msg, jetstream.WithExpectLastSequencePerSubject(st.seq))
		if isWrongLastSeq(err) {
			// Another operator acted first: judge against their action.
			continue
		}
		if err != nil {
			return res, fmt.Errorf("%s %s: append: %w", op, req.ToolName, err)
		}
		l.notePause(req.ProjectID, req.ToolName, pauseState{seq: ack.Sequence, paused: pause, entry: e})
		l.log.Info("tool "+map[bool]string{true: "paused", false: "resumed"}[pause], "project", req.ProjectID, "tool", req.ToolName, "actor", actor, "reason", req.Reason, "seq", ack.Sequence)
		res = protocol.ToolPauseResult{Seq: ack.Sequence, ToolName: req.ToolName, Paused: pause}
		if pause {
			return res, nil
		}
		if err := l.step(stepResumed); err != nil {
			return res, err
		}
		n, err := l.releasePaused(ctx, req.ProjectID, req.ToolName, st.seq, ack.Sequence)
		if err != nil {
			return res, fmt.Errorf("%s %s: release the held calls: %w", op, req.ToolName, err)
		}
		res.Released = n
		return res, nil
	}
	return res, fmt.Errorf("%s %s: the tool's state changed too often meanwhile", op, req.ToolName)
}

// resumeFinished makes sure the release of the resume st is (if it is one)
// is finished before a new command of the tool is published: a resume cut
// short by a crash would otherwise leave its held calls behind newer ones
// until the deadline keeper got to it. Once per resume and process: after
// that, a map lookup.
func (l *Ledger) resumeFinished(ctx context.Context, project, tool string, st pauseState) error {
	if st.seq == 0 || st.paused || st.entry.PauseSeq == 0 {
		return nil
	}
	k := pauseKey(project, tool)
	if done, ok := l.resumesDone.Load(k); ok && done.(uint64) >= st.seq {
		return nil
	}
	if _, err := l.finishResume(ctx, project, tool, st); err != nil {
		return fmt.Errorf("finish the resume %d of tool %s: %w", st.seq, tool, err)
	}
	l.resumesDone.Store(k, st.seq)
	return nil
}

// finishResumes finishes the release of every tool's last resume (each
// once per process; the tools ever paused are the pause subjects the
// stream holds). Errors are logged: the keeper finishes a resume later.
func (l *Ledger) finishResumes(ctx context.Context) {
	info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(protocol.PauseEntriesFilter(l.version)))
	if err != nil {
		l.log.Warn("finish resumes: list the paused tools", "err", err)
		return
	}
	for subj := range info.State.Subjects {
		sub, err := protocol.ParseSubject(subj)
		if err != nil || sub.Kind != protocol.SubjectPause {
			continue
		}
		st, err := l.pauseOf(ctx, sub.Project, sub.Tool, false)
		if err == nil {
			err = l.resumeFinished(ctx, sub.Project, sub.Tool, st)
		}
		if err != nil {
			l.log.Warn("finish resumes", "project", sub.Project, "tool", sub.Tool, "err", err)
		}
	}
}

// finishResume finishes the release of the resume st is (nothing when st
// is not a resume).
func (l *Ledger) finishResume(ctx context.Context, project, tool string, st pauseState) (int, error) {
	if st.paused || st.seq == 0 || st.entry.PauseSeq == 0 {
		return 0, nil
	}
	return l.releasePaused(ctx, project, tool, st.entry.PauseSeq, st.seq)
}

// releasePaused publishes, in dispatch order, the commands of the calls of
// tool held by the pause at pauseSeq and released by the resume at
// resumeSeq: the held entries of reason paused between the two. A call
// that ended meanwhile, or whose deadline passed (the deadline keeper
// times it out), is skipped. Each command append expects the resume to be
// the tool's state still, so a new pause stops the release: the new pause
// finished it before it was stored (toolPauseJSON), so what is left was
// released already. Idempotent: a resume cut short is finished by running
// it again.
func (l *Ledger) releasePaused(ctx context.Context, project, tool string, pauseSeq, resumeSeq uint64) (int, error) {
	// The ledger's own entries: no caller's actor on them.
	filter := protocol.CallEntriesFilter(l.version, project, protocol.SubjectHeld)
	running := pauseState{seq: resumeSeq}
	released := 0
	for from := pauseSeq + 1; from < resumeSeq; {
		m, err := l.stream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return released, nil
		}
		if err != nil {
			return released, fmt.Errorf("read held entries from %d: %w", from, err)
		}
		if m.Sequence >= resumeSeq {
			return released, nil
		}
		from = m.Sequence + 1
		var e pausedHeldEntry
		if err := json.Unmarshal(m.Data, &e); err != nil || e.Reason != protocol.HeldPaused || e.ToolName != tool {
			continue
		}
		out, err := l.releaseOne(ctx, &e, m.Sequence, running)
		if err != nil {
			return released, fmt.Errorf("release %s/%s: %w", e.AgentTurnID, e.ToolCallID, err)
		}
		switch out {
		case releasePublished:
			released++
			if err := l.step(stepResumeReleased); err != nil {
				return released, err
			}
		case releasePausedAgain:
			return released, nil
		}
	}
	return released, nil
}

// releaseOutcome is what releaseOne did with a held call.
type releaseOutcome int

const (
	releaseSkipped     releaseOutcome = iota // ended, past its deadline, or gone
	releasePublished                         // its command is out (by this or another release)
	releasePausedAgain                       // a new pause stopped the release
)

// releaseOne publishes the command of one held call, unless it ended or
// its deadline passed, and moves its record to dispatched.
func (l *Ledger) releaseOne(ctx context.Context, e *pausedHeldEntry, heldSeq uint64, st pauseState) (releaseOutcome, error) {
	key := callKey(e.ProjectID, e.AgentTurnID, e.ToolCallID)
	rec, rev, err := l.getRecord(ctx, key)
	if err != nil || rec == nil {
		return releaseSkipped, err
	}
	if rec.State == protocol.StateAwaitingApproval {
		// Approved, and held by the pause before its record said so: the
		// approval's follow-up publishes it now.
		settled, err := l.settleHeld(ctx, rec)
		if err != nil {
			return releaseSkipped, err
		}
		if settled.State == protocol.StateDispatched && settled.CommandSeq != 0 {
			return releasePublished, nil
		}
		return releaseSkipped, nil
	}
	if rec.State == protocol.StateDispatched && rec.CommandSeq != 0 {
		// Released already: by whoever finishes the same resume at the
		// same time (the keeper), so the op's count does not depend on it.
		return releasePublished, nil
	}
	if rec.State != protocol.StatePaused && rec.State != protocol.StateDispatched {
		return releaseSkipped, nil
	}
	if e.DeadlineUnixMS > 0 && time.Now().UnixMilli() >= e.DeadlineUnixMS {
		return releaseSkipped, nil
	}
	// The record says dispatched before the command exists: whoever takes
	// the command (an executor) must find the call dispatched, and a
	// dispatch still holding the call must find it released (Paused set).
	for range 16 {
		if rec.State == protocol.StateDispatched && rec.Paused != nil {
			break
		}
		next := cloneRecord(rec)
		next.State = protocol.StateDispatched
		if next.Paused == nil {
			next.Paused = &protocol.PausedCall{Header: e.CommandHeader, Payload: e.CommandPayload, PauseSeq: e.PauseSeq, HeldSeq: heldSeq}
		}
		if next.DeadlineUnixMS == 0 {
			next.DeadlineUnixMS = e.DeadlineUnixMS
		}
		nrev, ok, err := l.updateRecord(ctx, key, next, rev)
		if err != nil {
			return releaseSkipped, err
		}
		if ok {
			rec, rev = next, nrev
			break
		}
		if rec, rev, err = l.reread(ctx, key); err != nil {
			return releaseSkipped, err
		}
		switch {
		case rec.State == protocol.StateDispatched && rec.CommandSeq != 0:
			return releasePublished, nil
		case rec.State != protocol.StatePaused && rec.State != protocol.StateDispatched:
			return releaseSkipped, nil
		}
	}
	if err := l.step(stepResumeMarked); err != nil {
		return releaseSkipped, err
	}
	msg := &nats.Msg{Subject: e.CommandSubject, Data: e.CommandPayload, Header: nats.Header{}}
	for k, v := range e.CommandHeader {
		msg.Header[k] = slices.Clone(v)
	}
	ack, err := l.appendEntry(ctx, nil, protocol.KindCommand, msg, jetstream.WithExpectLastSequenceForSubject(st.seq, protocol.PauseSubject(l.version, e.ProjectID, e.ToolName)))
	if isWrongLastSeq(err) {
		// Paused again: that pause's op released this call before it was
		// stored (toolPauseJSON), or the call waits for the next resume.
		return releasePausedAgain, nil
	}
	if err != nil {
		return releaseSkipped, fmt.Errorf("publish command: %w", err)
	}
	if !ack.Duplicate {
		l.m.dispatches.WithLabelValues(l.callToolLabel(rec)).Inc()
	}
	rec.CommandSeq = ack.Sequence
	if err := l.recordSequences(ctx, key, rec, rev); err != nil {
		return releaseSkipped, err
	}
	return releasePublished, nil
}

// keepPausedHeld is the deadline keeper's handling of a held entry: the
// deadline of a call held by a pause, which has no command to carry it. At
// the deadline (and its grace), a call still held (or whose record did not
// get its command yet) is timed out. done=false asks to be handed the
// entry again after delay.
func (l *Ledger) keepPausedHeld(ctx context.Context, data []byte) (done bool, delay time.Duration, err error) {
	var e pausedHeldEntry
	if json.Unmarshal(data, &e) != nil || e.Reason != protocol.HeldPaused || e.DeadlineUnixMS <= 0 {
		return true, 0, nil
	}
	if due := time.UnixMilli(e.DeadlineUnixMS).Add(l.grace); time.Now().Before(due) {
		return false, time.Until(due), nil
	}
	rec, _, err := l.getRecord(ctx, callKey(e.ProjectID, e.AgentTurnID, e.ToolCallID))
	if err != nil || rec == nil {
		return err == nil, 0, err
	}
	if rec, err = l.settleHeld(ctx, rec); err != nil {
		return false, 0, err
	}
	if rec.State != protocol.StatePaused && rec.State != protocol.StateDispatched {
		// Reported already; or still awaiting an approval (no deadline).
		return true, 0, nil
	}
	if rec.DeadlineUnixMS == 0 {
		rec.DeadlineUnixMS = e.DeadlineUnixMS
	}
	if _, err := l.recordTimeout(ctx, rec); err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) && (pe.Code == protocol.CodeConflict || pe.Code == protocol.CodeStaleEpoch) {
			return true, 0, nil
		}
		return false, 0, err
	}
	return true, 0, nil
}

// keepResume is the deadline keeper's handling of a tool_pause entry: a
// resume's release is finished (whoever appended it may have stopped
// midway; finishing is idempotent).
func (l *Ledger) keepResume(ctx context.Context, seq uint64, data []byte) error {
	var e protocol.ToolPauseEntry
	if json.Unmarshal(data, &e) != nil || e.Paused || e.PauseSeq == 0 {
		return nil
	}
	if _, err := l.releasePaused(ctx, e.ProjectID, e.ToolName, e.PauseSeq, seq); err != nil {
		return fmt.Errorf("finish the resume %d of tool %s: %w", seq, e.ToolName, err)
	}
	return nil
}
