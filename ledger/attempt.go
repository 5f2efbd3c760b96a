package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// StartAttempt records an attempt of a side_effectful tool before it runs
// (the intent before the effect), or says which attempt is open.
//
// With req.NotDone == 0 it records attempt 1 when the call has none, and
// answers Started=false with the latest attempt when it has one: that
// attempt has no outcome (the call has no report), so its runner died or
// is still running, and the caller must reconcile it, never run the tool.
// With req.NotDone == n (the caller's reconcile found attempt n not done)
// it records attempt n+1, closing n, if n is still the latest; else it
// answers Started=false with the latest, to be reconciled in turn.
//
// Exactly one entry is stored per (call, attempt number): the append
// expects the attempt subject's last sequence to be the one read, so of
// two concurrent starts one is stored and the other answered Started=false.
// A call that already has a report is refused (conflict).
func (l *Ledger) StartAttempt(ctx context.Context, req protocol.AttemptStartRequest) (protocol.AttemptStartResult, error) {
	by := callerOf(ctx)
	ident := protocol.ValidIdentifier
	if ident(req.ProjectID) && ident(req.AgentTurnID) && ident(req.ToolCallID) && protocol.ValidName(req.ExecutorID) &&
		req.DeadlineUnixMS >= 0 && req.NotDone <= math.MaxInt64 {
		// Certainly valid: what the API's parser would read back from its
		// JSON, with no violation.
		return l.startAttempt(ctx, by, req, rawOf(req))
	}
	return viaWire(ctx, protocol.OpAttemptStart, req, func(ctx context.Context, body []byte) (protocol.AttemptStartResult, error) {
		return l.startAttemptJSON(ctx, by, nil, body)
	})
}

// startAttemptJSON parses an attempt.start as received over the API, once,
// for the core; by is who sent it (nil in process).
func (l *Ledger) startAttemptJSON(ctx context.Context, by *protocol.Caller, h nats.Header, body []byte) (protocol.AttemptStartResult, error) {
	req, vs := protocol.ParseAttemptStart(body)
	raw := func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", h, body) }
	if len(vs) > 0 {
		return protocol.AttemptStartResult{}, l.reject(ctx, by, protocol.OpAttemptStart, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeBadRequest, vs, "invalid attempt.start: %d violation(s)", len(vs)), raw())
	}
	return l.startAttempt(ctx, by, req, raw)
}

// startAttempt is the one core of attempt.start, typed or received: req is
// valid, by is who sent it (its tool must be the call's; nil in
// process), raw is the request a refusal records.
func (l *Ledger) startAttempt(ctx context.Context, by *protocol.Caller, req protocol.AttemptStartRequest, raw func() protocol.RejectedRequest) (protocol.AttemptStartResult, error) {
	var none protocol.AttemptStartResult
	var vs protocol.Violations
	rec, err := l.GetCall(ctx, req.ProjectID, req.AgentTurnID, req.ToolCallID)
	if e, refused := protocol.AsError(err); refused && e.Code == protocol.CodeUnknownCall {
		vs.Add("body.tool_call_id", protocol.VNotFound, "no call %s in turn %s was dispatched through the ledger", req.ToolCallID, req.AgentTurnID)
		return none, l.reject(ctx, by, protocol.OpAttemptStart, req.ProjectID, protocol.Unrouted, protocol.NewError(protocol.CodeUnknownCall, vs, "unknown call %s", req.ToolCallID), raw())
	}
	if err != nil {
		return none, fmt.Errorf("attempt.start %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
	}
	if vs := callerOwnsCall(by, rec); len(vs) > 0 {
		return none, l.reject(ctx, by, protocol.OpAttemptStart, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeForbidden, vs, "attempt.start of call %s by another tool", rec.ToolCallID), raw())
	}
	reportSubj := protocol.ReportSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	alreadyReported := func() (protocol.AttemptStartResult, error) {
		var vs protocol.Violations
		vs.Add("body.tool_call_id", protocol.VConflict, "call %s already has a report: it has an outcome, no attempt may start", rec.ToolCallID)
		return none, l.reject(ctx, by, protocol.OpAttemptStart, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeConflict, vs, "call %s is already reported", rec.ToolCallID), raw())
	}
	if rec.State != protocol.StateDispatched {
		return alreadyReported()
	}
	// Only a side_effectful tool records intent: an attempt on record turns
	// the call's deadline into outcome_unknown, which a pure or idempotent
	// tool's credential must not be able to bring about (found from
	// outside). Judged by the definition the call pinned at dispatch; a
	// call of an unregistered tool pinned none and is taken at its word.
	if rec.ToolDefSeq != 0 {
		// The definition in force is normally the pinned one, and in memory.
		st, err := l.registeredTool(ctx, rec.ProjectID, rec.ToolName)
		if err == nil && (st == nil || st.Seq != rec.ToolDefSeq) {
			st, err = l.GetToolAt(ctx, rec.ProjectID, rec.ToolName, rec.ToolDefSeq)
		}
		if err != nil {
			return none, fmt.Errorf("attempt.start %s/%s: read the pinned definition: %w", req.AgentTurnID, req.ToolCallID, err)
		}
		if st.Definition.Determinism != protocol.DeterminismSideEffectful {
			vs.Add("body.tool_call_id", protocol.VConflict, "call %s is to tool %s, whose definition (seq %d) is %s: only a side_effectful tool records attempts", rec.ToolCallID, rec.ToolName, rec.ToolDefSeq, st.Definition.Determinism)
			return none, l.reject(ctx, by, protocol.OpAttemptStart, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeConflict, vs, "tool %s is not side_effectful", rec.ToolName), raw())
		}
	}
	subj := protocol.AttemptSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	key := protocol.IdempotencyKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)
	// Two tries: a concurrent start between the read and the append makes
	// the append fail, and the second read answers with that attempt.
	for range 2 {
		last, lastEntry, err := l.lastAttempt(ctx, subj)
		if err != nil {
			return none, fmt.Errorf("attempt.start %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
		}
		var next uint64 = 1
		switch {
		case last == nil && req.NotDone != 0:
			vs.Add("body.not_done", protocol.VNotFound, "call %s has no attempt %d on record", rec.ToolCallID, req.NotDone)
			return none, l.reject(ctx, by, protocol.OpAttemptStart, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeMismatch, vs, "no attempt %d of call %s to close", req.NotDone, rec.ToolCallID), raw())
		case last != nil && req.NotDone != lastEntry.Attempt:
			// Open (no report): reconcile it. A stale not_done (someone
			// else already moved on) lands here too.
			return openAttempt(last, lastEntry), nil
		case last != nil:
			next = lastEntry.Attempt + 1
		}
		e := protocol.AttemptEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID,
			ToolCallID: rec.ToolCallID, ToolName: rec.ToolName, Attempt: next, ExecutorID: req.ExecutorID, IdempotencyKey: key,
			DeadlineUnixMS: req.DeadlineUnixMS}
		var lastSeq uint64
		if last != nil {
			e.PreviousOutcome, lastSeq = protocol.AttemptNotDone, last.Sequence
		}
		data, err := json.Marshal(e)
		if err != nil {
			return none, fmt.Errorf("attempt.start: encode entry: %w", err)
		}
		msg := &nats.Msg{Subject: subj, Data: data, Header: protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID}.Header()}
		msg.Header.Set(protocol.HeaderProjectID, rec.ProjectID)
		msg.Header.Set(protocol.HeaderChannelID, rec.ChannelID)
		msg.Header.Set(protocol.HeaderIdempotencyKey, key)
		msg.Header.Set(protocol.HeaderMsgID, "attempt."+rec.ProjectID+"."+rec.AgentTurnID+"."+rec.ToolCallID+"."+strconv.FormatUint(next, 10))
		ack, err := l.appendEntry(ctx, by, protocol.KindAttempt, msg, jetstream.WithExpectLastSequenceForSubject(lastSeq, subj))
		switch {
		case err == nil && !ack.Duplicate:
			// Started only now that the report subject is known to be
			// empty after the append: a report stored meanwhile means
			// the call has its outcome and the attempt must not run.
			if m, err := l.lastForSubject(ctx, reportSubj); err != nil {
				return none, fmt.Errorf("attempt.start %s/%s: %w", req.AgentTurnID, req.ToolCallID, err)
			} else if m != nil {
				return alreadyReported()
			}
			return protocol.AttemptStartResult{Started: true, Attempt: next, Seq: ack.Sequence, IdempotencyKey: key, ExecutorID: e.ExecutorID, DeadlineUnixMS: e.DeadlineUnixMS}, nil
		case err == nil || isWrongLastSeq(err):
			// Stored by someone else (or by this request before a lost
			// reply): never a licence to run. Read it and answer open.
			continue
		default:
			return none, fmt.Errorf("attempt.start %s/%s: append: %w", req.AgentTurnID, req.ToolCallID, err)
		}
	}
	last, lastEntry, err := l.lastAttempt(ctx, subj)
	if err != nil || last == nil {
		return none, fmt.Errorf("attempt.start %s/%s: read attempt after a concurrent start: %w", req.AgentTurnID, req.ToolCallID, err)
	}
	return openAttempt(last, lastEntry), nil
}

func openAttempt(m *jetstream.RawStreamMsg, e *protocol.AttemptEntry) protocol.AttemptStartResult {
	return protocol.AttemptStartResult{Attempt: e.Attempt, Seq: m.Sequence, IdempotencyKey: e.IdempotencyKey, ExecutorID: e.ExecutorID, DeadlineUnixMS: e.DeadlineUnixMS}
}

// lastAttempt reads the call's latest attempt entry; nil when it has none.
func (l *Ledger) lastAttempt(ctx context.Context, subj string) (*jetstream.RawStreamMsg, *protocol.AttemptEntry, error) {
	m, err := l.lastForSubject(ctx, subj)
	if err != nil || m == nil {
		return nil, nil, err
	}
	var e protocol.AttemptEntry
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return nil, nil, fmt.Errorf("decode attempt entry %d: %w", m.Sequence, err)
	}
	return m, &e, nil
}
