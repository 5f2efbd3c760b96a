package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// Prepare records that a call's tool prepared it (phase 1 of a two-phase
// commit) with a commit token and a commit deadline, and wakes the call's
// worker with it. At most one prepare is stored per call: the append
// expects the call's prepared subject to be empty. A repeat of the stored
// prepare (same token and deadline) is answered as a duplicate; any other
// prepare of a prepared call, or a prepare of a reported call, is refused.
func (l *Ledger) Prepare(ctx context.Context, req protocol.PrepareRequest) (protocol.PrepareResult, error) {
	by := callerOf(ctx)
	ident := protocol.ValidIdentifier
	if ident(req.ProjectID) && ident(req.AgentTurnID) && ident(req.ToolCallID) && certainCommitToken(req.CommitToken) && req.CommitDeadlineUnixMS > 0 {
		// Certainly valid: what the API's parser would read back from its
		// JSON, with no violation.
		return l.prepare(ctx, by, req, rawOf(req))
	}
	return viaWire(ctx, protocol.OpPrepare, req, func(ctx context.Context, body []byte) (protocol.PrepareResult, error) {
		return l.prepareJSON(ctx, by, nil, body)
	})
}

// certainCommitToken reports whether t is a commit token the parser
// accepts: 1 to MaxCommitTokenLen printable ASCII characters, no spaces.
func certainCommitToken(t string) bool {
	if t == "" || len(t) > protocol.MaxCommitTokenLen {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			return false
		}
	}
	return true
}

// prepareJSON parses a prepare as received over the API, once, for the
// core; by is who sent it (nil in process).
func (l *Ledger) prepareJSON(ctx context.Context, by *protocol.Caller, h nats.Header, body []byte) (protocol.PrepareResult, error) {
	req, vs := protocol.ParsePrepare(body)
	raw := func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", h, body) }
	if len(vs) > 0 {
		return protocol.PrepareResult{}, l.reject(ctx, by, protocol.OpPrepare, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeBadRequest, vs, "invalid prepare: %d violation(s)", len(vs)), raw())
	}
	return l.prepare(ctx, by, req, raw)
}

// prepare is the one core of a prepare, typed or received: req is valid,
// by is who sent it (its tool must be the call's; nil in process), raw
// is the request a refusal records.
func (l *Ledger) prepare(ctx context.Context, by *protocol.Caller, req protocol.PrepareRequest, raw func() protocol.RejectedRequest) (protocol.PrepareResult, error) {
	var none protocol.PrepareResult
	var vs protocol.Violations
	rec, err := l.knownCall(ctx, by, protocol.OpPrepare, req.ProjectID, req.AgentTurnID, req.ToolCallID, raw)
	if err != nil {
		return none, err
	}
	refuse := func(code protocol.Code, vs protocol.Violations, format string, args ...any) (protocol.PrepareResult, error) {
		return none, l.reject(ctx, by, protocol.OpPrepare, rec.ProjectID, rec.ChannelID, protocol.NewError(code, vs, format, args...), raw())
	}
	if vs := callerOwnsCall(by, rec); len(vs) > 0 {
		return refuse(protocol.CodeForbidden, vs, "prepare of call %s by another tool", rec.ToolCallID)
	}
	if rec.State != protocol.StateDispatched {
		vs.Add("body.tool_call_id", protocol.VConflict, "call %s already has a report: it cannot be prepared", rec.ToolCallID)
		return refuse(protocol.CodeConflict, vs, "call %s is already reported", rec.ToolCallID)
	}
	target, ok := toolTarget(rec)
	if !ok {
		vs.Add("body.tool_call_id", protocol.VInvalidValue, "call %s was dispatched on %s, not to a tool's command subject: only a tool service can prepare", rec.ToolCallID, rec.Subject)
	}
	now := time.Now()
	if d := time.UnixMilli(req.CommitDeadlineUnixMS); !d.After(now) {
		vs.Add("body.commit_deadline_unix_ms", protocol.VInvalidValue, "commit deadline %s has passed", protocol.FormatTime(d))
	} else if dl := rec.Deadline(); !dl.IsZero() && d.After(dl) {
		vs.Add("body.commit_deadline_unix_ms", protocol.VInvalidValue, "commit deadline %s is after the call's deadline %s (deadline_unix_ms %d)", protocol.FormatTime(d), protocol.FormatTime(dl), rec.DeadlineUnixMS)
	}
	if len(vs) > 0 {
		return refuse(protocol.CodeBadRequest, vs, "invalid prepare of call %s: %d violation(s)", rec.ToolCallID, len(vs))
	}
	e := protocol.PreparedEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID,
		TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, ToolName: rec.ToolName, CommitToken: req.CommitToken,
		CommitDeadlineUnixMS: req.CommitDeadlineUnixMS, ToolTarget: target}
	data, err := json.Marshal(e)
	if err != nil {
		return none, fmt.Errorf("prepare: encode entry: %w", err)
	}
	subj := protocol.PreparedSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	msg := &nats.Msg{Subject: subj, Data: data, Header: callHeader(rec)}
	ack, err := l.appendEntry(ctx, by, protocol.KindPrepared, msg, jetstream.WithExpectLastSequencePerSubject(0))
	out := protocol.PrepareResult{}
	switch {
	case err == nil:
		out.Seq = ack.Sequence
	case isWrongLastSeq(err):
		m, prev, err := l.prepared(ctx, rec)
		if err != nil || prev == nil {
			return none, fmt.Errorf("prepare %s/%s: read the stored prepare: %w", rec.AgentTurnID, rec.ToolCallID, err)
		}
		if prev.CommitToken != req.CommitToken || prev.CommitDeadlineUnixMS != req.CommitDeadlineUnixMS {
			vs.Add("body.commit_token", protocol.VConflict, "call %s was already prepared (seq %d) with another commit token or commit deadline", rec.ToolCallID, m.Sequence)
			return refuse(protocol.CodeConflict, vs, "call %s is already prepared", rec.ToolCallID)
		}
		out.Seq, out.Duplicate = m.Sequence, true
	default:
		return none, fmt.Errorf("prepare %s/%s: append: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	// The wakeup follows the entry: a prepare retried after a crash
	// between the two publishes it then (deduplicated by its message id).
	seq, err := l.wakePrepared(ctx, by, rec, out.Seq)
	if err != nil {
		return none, fmt.Errorf("prepare %s/%s: wakeup: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	out.WakeupSeq = seq
	return out, nil
}

// wakePrepared publishes the prepared call's wakeup to its agent's worker
// target (0: the agent has no roster entry).
func (l *Ledger) wakePrepared(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord, preparedSeq uint64) (uint64, error) {
	roster, err := l.rosterCached(ctx, rec.ProjectID, rec.AgentID)
	if isCode(err, protocol.CodeNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	data, err := json.Marshal(protocol.WakeupEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID,
		WorkerTarget: roster.WorkerTarget, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID,
		Status: protocol.PhasePrepared, ReportSeq: preparedSeq, Phase: protocol.PhasePrepared})
	if err != nil {
		return 0, err
	}
	msg := &nats.Msg{Subject: protocol.WakeupSubject(l.version, rec.ProjectID, rec.ChannelID, roster.WorkerTarget), Data: data,
		Header: protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, StepID: rec.StepID}.Header()}
	msg.Header.Set(protocol.HeaderMsgID, "wakeup.prepared."+rec.ProjectID+"."+rec.AgentTurnID+"."+rec.ToolCallID)
	ack, err := l.appendEntry(ctx, by, protocol.KindWakeup, msg)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// Commit records the worker's commit of a prepared call and routes it to
// the call's tool. See decide.
func (l *Ledger) Commit(ctx context.Context, req protocol.DecisionRequest) (protocol.DecisionResult, error) {
	by := callerOf(ctx)
	return l.decideReq(ctx, by, protocol.OpCommit, req)
}

// Abort records the worker's abort of a prepared call and routes the
// rollback to the call's tool. See decide.
func (l *Ledger) Abort(ctx context.Context, req protocol.DecisionRequest) (protocol.DecisionResult, error) {
	by := callerOf(ctx)
	return l.decideReq(ctx, by, protocol.OpAbort, req)
}

func (l *Ledger) decideReq(ctx context.Context, by *protocol.Caller, op string, req protocol.DecisionRequest) (protocol.DecisionResult, error) {
	ident := protocol.ValidIdentifier
	if ident(req.ProjectID) && ident(req.AgentID) && ident(req.AgentTurnID) && ident(req.ToolCallID) && certainCommitToken(req.CommitToken) {
		// Certainly valid: what the API's parser would read back from its
		// JSON, with no violation.
		return l.decideTwoPhase(ctx, by, op, req, rawOf(req))
	}
	return viaWire(ctx, op, req, func(ctx context.Context, body []byte) (protocol.DecisionResult, error) {
		return l.decideJSON(ctx, by, op, nil, body)
	})
}

// decideJSON is commit or abort (op) for a JSON body. Exactly one decision
// is stored per call: the append expects the call's decision subject to be
// empty, so of a commit, an abort and the ledger's abort at the commit
// deadline racing, one is stored, and every other is refused (conflict),
// listed and recorded. So is a decision with another commit token, for a
// call not prepared or already reported, by another agent, or after the
// commit deadline (which records the ledger's abort if nobody has yet).
func (l *Ledger) decideJSON(ctx context.Context, by *protocol.Caller, op string, h nats.Header, body []byte) (protocol.DecisionResult, error) {
	req, vs := protocol.ParseDecision(body)
	raw := func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", h, body) }
	if len(vs) > 0 {
		return protocol.DecisionResult{}, l.reject(ctx, by, op, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeBadRequest, vs, "invalid %s: %d violation(s)", op, len(vs)), raw())
	}
	return l.decideTwoPhase(ctx, by, op, req, raw)
}

// decideTwoPhase is the one core of commit and abort (op), typed or received: req
// is valid, raw is the request a refusal records.
func (l *Ledger) decideTwoPhase(ctx context.Context, by *protocol.Caller, op string, req protocol.DecisionRequest, raw func() protocol.RejectedRequest) (protocol.DecisionResult, error) {
	var none protocol.DecisionResult
	var vs protocol.Violations
	rec, err := l.knownCall(ctx, by, op, req.ProjectID, req.AgentTurnID, req.ToolCallID, raw)
	if err != nil {
		return none, err
	}
	refuse := func(code protocol.Code, vs protocol.Violations, format string, args ...any) (protocol.DecisionResult, error) {
		return none, l.reject(ctx, by, op, rec.ProjectID, rec.ChannelID, protocol.NewError(code, vs, format, args...), raw())
	}
	if rec.AgentID != req.AgentID {
		vs.Add("body.agent_id", protocol.VMismatch, "call %s belongs to agent %q, not %q", rec.ToolCallID, rec.AgentID, req.AgentID)
		return refuse(protocol.CodeMismatch, vs, "call %s is not agent %s's", rec.ToolCallID, req.AgentID)
	}
	pm, prep, err := l.prepared(ctx, rec)
	if err != nil {
		return none, fmt.Errorf("%s %s/%s: %w", op, rec.AgentTurnID, rec.ToolCallID, err)
	}
	if prep == nil {
		vs.Add("body.tool_call_id", protocol.VNotFound, "call %s was not prepared by its tool: there is nothing to %s", rec.ToolCallID, op)
		return refuse(protocol.CodeConflict, vs, "call %s is not prepared", rec.ToolCallID)
	}
	if req.CommitToken != prep.CommitToken {
		vs.Add("body.commit_token", protocol.VMismatch, "is not the commit token of call %s's prepare (seq %d)", rec.ToolCallID, pm.Sequence)
		return refuse(protocol.CodeMismatch, vs, "wrong commit token for call %s", rec.ToolCallID)
	}
	decided := func(dm *jetstream.RawStreamMsg, d *protocol.DecisionEntry) (protocol.DecisionResult, error) {
		var vs protocol.Violations
		vs.Add("body.commit_token", protocol.VConflict, "commit token of call %s is consumed: the call was decided %s by %s (seq %d)", rec.ToolCallID, d.Decision, d.DecidedBy, dm.Sequence)
		return refuse(protocol.CodeConflict, vs, "call %s is already decided (%s)", rec.ToolCallID, d.Decision)
	}
	dm, d, err := l.decision(ctx, prep)
	if err != nil {
		return none, fmt.Errorf("%s %s/%s: %w", op, rec.AgentTurnID, rec.ToolCallID, err)
	}
	if d != nil {
		return decided(dm, d)
	}
	if rec.State != protocol.StateDispatched {
		vs.Add("body.tool_call_id", protocol.VConflict, "call %s already has a report (it reached its deadline, or its tool reported): it can no longer be decided", rec.ToolCallID)
		return refuse(protocol.CodeConflict, vs, "call %s is already reported", rec.ToolCallID)
	}
	if !time.Now().Before(time.UnixMilli(prep.CommitDeadlineUnixMS)) {
		dm, d, err := l.autoAbort(ctx, pm.Sequence, prep)
		if err != nil {
			return none, fmt.Errorf("%s %s/%s: %w", op, rec.AgentTurnID, rec.ToolCallID, err)
		}
		if d.DecidedBy != protocol.DecidedByCommitDeadline {
			return decided(dm, d)
		}
		vs.Add("body.commit_token", protocol.VLate, "the commit deadline of call %s (%s) passed with no decision: the ledger aborted it (seq %d)", rec.ToolCallID, protocol.FormatTime(time.UnixMilli(prep.CommitDeadlineUnixMS)), dm.Sequence)
		return refuse(protocol.CodeConflict, vs, "call %s was aborted at its commit deadline", rec.ToolCallID)
	}
	decision := protocol.DecisionCommit
	if op == protocol.OpAbort {
		decision = protocol.DecisionAbort
	}
	seq, stored, err := l.appendDecision(ctx, by, pm.Sequence, prep, decision, protocol.DecidedByWorker)
	if err != nil {
		return none, fmt.Errorf("%s %s/%s: %w", op, rec.AgentTurnID, rec.ToolCallID, err)
	}
	if stored != nil {
		return decided(stored, storedDecision(stored))
	}
	return protocol.DecisionResult{Seq: seq, Decision: decision}, nil
}

// autoAbort records the ledger's abort of a prepared call whose commit
// deadline passed, unless a decision is stored; it returns the stored one.
func (l *Ledger) autoAbort(ctx context.Context, preparedSeq uint64, prep *protocol.PreparedEntry) (*jetstream.RawStreamMsg, *protocol.DecisionEntry, error) {
	// The ledger's own entry: no caller's actor on it.
	_, stored, err := l.appendDecision(ctx, nil, preparedSeq, prep, protocol.DecisionAbort, protocol.DecidedByCommitDeadline)
	if err != nil {
		return nil, nil, err
	}
	if stored != nil {
		return stored, storedDecision(stored), nil
	}
	return l.decision(ctx, prep)
}

// appendDecision stores a call's one decision on its decision subject,
// which must be empty. stored is the decision already there when it was
// not (its data decodes: storedDecision).
func (l *Ledger) appendDecision(ctx context.Context, by *protocol.Caller, preparedSeq uint64, prep *protocol.PreparedEntry, decision, decidedBy string) (uint64, *jetstream.RawStreamMsg, error) {
	data, err := json.Marshal(protocol.DecisionEntry{ProjectID: prep.ProjectID, ChannelID: prep.ChannelID, AgentID: prep.AgentID,
		AgentTurnID: prep.AgentTurnID, TurnEpoch: prep.TurnEpoch, ToolCallID: prep.ToolCallID, ToolName: prep.ToolName,
		Decision: decision, DecidedBy: decidedBy, CommitToken: prep.CommitToken, PreparedSeq: preparedSeq})
	if err != nil {
		return 0, nil, fmt.Errorf("encode decision: %w", err)
	}
	subj := protocol.DecisionSubject(l.version, prep.ProjectID, prep.ChannelID, prep.ToolTarget, prep.AgentTurnID, prep.ToolCallID)
	msg := &nats.Msg{Subject: subj, Data: data, Header: protocol.Identity{AgentID: prep.AgentID, AgentTurnID: prep.AgentTurnID, TurnEpoch: prep.TurnEpoch, ToolCallID: prep.ToolCallID}.Header()}
	msg.Header.Set(protocol.HeaderProjectID, prep.ProjectID)
	msg.Header.Set(protocol.HeaderChannelID, prep.ChannelID)
	ack, err := l.appendEntry(ctx, by, protocol.KindDecision, msg, jetstream.WithExpectLastSequencePerSubject(0))
	if err == nil {
		l.m.decisions.WithLabelValues(decision, decidedBy).Inc()
		return ack.Sequence, nil, nil
	}
	if !isWrongLastSeq(err) {
		return 0, nil, fmt.Errorf("append decision: %w", err)
	}
	m, err := l.lastForSubject(ctx, subj)
	if err != nil || m == nil {
		return 0, nil, fmt.Errorf("decision stored but cannot be read: %w", err)
	}
	return m.Sequence, m, nil
}

func storedDecision(m *jetstream.RawStreamMsg) *protocol.DecisionEntry {
	var d protocol.DecisionEntry
	_ = json.Unmarshal(m.Data, &d)
	return &d
}

// prepared reads a call's prepared entry; nil when it has none.
func (l *Ledger) prepared(ctx context.Context, rec *protocol.CallRecord) (*jetstream.RawStreamMsg, *protocol.PreparedEntry, error) {
	m, err := l.lastForSubject(ctx, protocol.PreparedSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil || m == nil {
		return nil, nil, err
	}
	var e protocol.PreparedEntry
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return nil, nil, fmt.Errorf("decode prepared entry %d: %w", m.Sequence, err)
	}
	return m, &e, nil
}

// decision reads a prepared call's decision; nil when it has none.
func (l *Ledger) decision(ctx context.Context, prep *protocol.PreparedEntry) (*jetstream.RawStreamMsg, *protocol.DecisionEntry, error) {
	m, err := l.lastForSubject(ctx, protocol.DecisionSubject(l.version, prep.ProjectID, prep.ChannelID, prep.ToolTarget, prep.AgentTurnID, prep.ToolCallID))
	if err != nil || m == nil {
		return nil, nil, err
	}
	var d protocol.DecisionEntry
	if err := json.Unmarshal(m.Data, &d); err != nil {
		return nil, nil, fmt.Errorf("decode decision entry %d: %w", m.Sequence, err)
	}
	return m, &d, nil
}

// TwoPhase reads a call's two-phase state (call.get with two_phase): nil
// when its tool never prepared it.
func (l *Ledger) TwoPhase(ctx context.Context, project, turnID, callID string) (*protocol.TwoPhase, error) {
	rec, err := l.GetCall(ctx, project, turnID, callID)
	if err != nil {
		return nil, err
	}
	return l.twoPhase(ctx, rec)
}

func (l *Ledger) twoPhase(ctx context.Context, rec *protocol.CallRecord) (*protocol.TwoPhase, error) {
	pm, prep, err := l.prepared(ctx, rec)
	if err != nil || prep == nil {
		return nil, err
	}
	tp := &protocol.TwoPhase{State: protocol.PhasePrepared, CommitToken: prep.CommitToken, CommitDeadlineUnixMS: prep.CommitDeadlineUnixMS, PreparedSeq: pm.Sequence}
	dm, d, err := l.decision(ctx, prep)
	if err != nil || d == nil {
		return tp, err
	}
	tp.State, tp.DecisionSeq, tp.DecidedBy = protocol.PhaseAborted, dm.Sequence, d.DecidedBy
	if d.Decision == protocol.DecisionCommit {
		tp.State = protocol.PhaseCommitted
	}
	return tp, nil
}

// knownCall reads a dispatched call for op, refusing (recorded) an unknown one.
func (l *Ledger) knownCall(ctx context.Context, by *protocol.Caller, op, project, turnID, callID string, raw func() protocol.RejectedRequest) (*protocol.CallRecord, error) {
	rec, err := l.GetCall(ctx, project, turnID, callID)
	if e, refused := protocol.AsError(err); refused && e.Code == protocol.CodeUnknownCall {
		var vs protocol.Violations
		vs.Add("body.tool_call_id", protocol.VNotFound, "no call %s in turn %s was dispatched through the ledger", callID, turnID)
		return nil, l.reject(ctx, by, op, project, protocol.Unrouted, protocol.NewError(protocol.CodeUnknownCall, vs, "unknown call %s", callID), raw())
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", op, turnID, callID, err)
	}
	return rec, nil
}

// toolTarget is the first target token of a call's tool command subject.
func toolTarget(rec *protocol.CallRecord) (string, bool) {
	sub, err := protocol.ParseSubject(rec.Subject)
	if err != nil || sub.Kind != protocol.SubjectToolCommand || len(sub.Target) == 0 {
		return "", false
	}
	return sub.Target[0], true
}

// callHeader is the identity header block of an entry about rec.
func callHeader(rec *protocol.CallRecord) nats.Header {
	h := protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID}.Header()
	h.Set(protocol.HeaderProjectID, rec.ProjectID)
	h.Set(protocol.HeaderChannelID, rec.ChannelID)
	return h
}
