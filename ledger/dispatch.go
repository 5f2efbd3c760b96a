package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/cgledger/cgledger/internal/backoff"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Dispatch writes the tool.call card, records the call, and publishes the
// command, in that order, so a crash never leaves a command whose card is
// missing. Repeating the same dispatch returns the original outcome.
func (l *Ledger) Dispatch(ctx context.Context, req protocol.DispatchRequest) (protocol.DispatchResult, error) {
	by := callerOf(ctx)
	// The card's content (any JSON as arguments) is validated on bytes, by
	// the card decoder, whose encoding is then the one stored.
	card, err := json.Marshal(req.Card)
	if err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("dispatch: encode card: %w", err)
	}
	checks := req.Checks
	if !checks.Any() {
		// {} asks for nothing: the same dispatch as none (its fingerprint).
		checks = nil
	}
	in := dispatchInput{subject: req.Subject, header: req.Identity.Header(), card: card, approval: req.Approval, checks: checks}
	// The identity and the payload, when certainly valid, are taken as they
	// are; anything else is read through the API's parsers, over the bytes
	// it would have been sent as.
	if identityCertain(req.Identity) {
		id := req.Identity
		in.id = &id
	}
	if payloadCertain(req.Payload) {
		p := req.Payload
		in.typedPayload = &p
	} else if in.payload, err = json.Marshal(req.Payload); err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("dispatch: encode payload: %w", err)
	}
	return l.dispatch(ctx, by, in)
}

// identityCertain reports whether id is one protocol.ParseIdentity reads
// back unchanged and without a violation from id.Header(), with the tool
// call id required (a step id, required of a PMO command, is checked where
// the subject is known).
func identityCertain(id protocol.Identity) bool {
	ident := protocol.ValidIdentifier
	optIdent := func(s string) bool { return s == "" || ident(s) }
	return ident(id.AgentID) && ident(id.AgentTurnID) && ident(id.ToolCallID) &&
		optIdent(id.StepID) && optIdent(id.ContextBoxID) &&
		(id.Traceparent == "" || protocol.ValidTraceparent(id.Traceparent)) &&
		// A trace state rides along unread: only one that is certainly a
		// valid header value (printable ASCII) is taken as it is.
		len(id.Tracestate) <= 512 && printableASCII(id.Tracestate)
}

// payloadCertain reports whether p is a command payload that
// protocol.DecodeCommandPayload reads back unchanged and without a
// violation from its JSON encoding, whatever the subject (a PMO command's
// tool_name is checked where the subject is known).
func payloadCertain(p protocol.ToolCommandPayload) bool {
	return protocol.ValidIdentifier(p.ToolCallCardID) &&
		(p.ToolName == "" || protocol.ValidName(p.ToolName)) &&
		protocol.ValidAfterExecution(p.AfterExecution) &&
		(p.TimeoutMS == 0 || (p.TimeoutMS >= 1 && p.TimeoutMS <= 24*3600*1000)) &&
		// A dispatch must not carry one: the parser's way names it.
		p.DeadlineUnixMS == 0
}

// dispatchMsg is Dispatch for an API request: CG-* identity in h, and a JSON
// body {"subject", "card", "payload"}.
//
// api is the request on an API subject whose caller check this runs
// (callerChecked): first, over the bytes, when the body does not read;
// else once the parts are read (dispatchTraced).
func (l *Ledger) dispatchMsg(ctx context.Context, by *protocol.Caller, api *apiRequest, h nats.Header, body []byte) (protocol.DispatchResult, error) {
	b, vs, ok := protocol.ParseDispatchBody(body)
	if !ok {
		if api != nil {
			if err := l.callerChecked(ctx, api, api.bytesCaller); err != nil {
				return protocol.DispatchResult{}, err
			}
		}
		return protocol.DispatchResult{}, l.reject(ctx, by, protocol.OpDispatch, "", "", protocol.NewError(protocol.CodeBadRequest, vs, "invalid dispatch request: %d violation(s)", len(vs)), protocol.NewRejectedRequest("", h, body))
	}
	// A body that repeats a key is refused, but checked through like any
	// other so that every problem is listed; its refusal keeps the body as
	// received (a re-encoding would keep one copy of the key).
	var asReceived []byte
	if len(vs) > 0 {
		asReceived = body
	}
	return l.dispatch(ctx, by, dispatchInput{subject: b.Subject, header: h, card: b.Card, payload: b.Payload, approval: b.Approval, checks: b.Checks, found: vs, asReceived: asReceived, api: api})
}

// dispatchInput is a dispatch as the ledger takes it, from a worker's
// request (typed, or as received over the API) or a redrive entry. The
// core (dispatchTraced) parses what is given as bytes once, and takes what
// is given typed (certainly valid) as it is.
type dispatchInput struct {
	subject       string
	header        nats.Header
	card, payload []byte
	// id, when set, is the identity header holds, already known valid.
	id *protocol.Identity
	// typedPayload, when set, is the payload (payload is then nil), already
	// known valid.
	typedPayload *protocol.ToolCommandPayload
	approval     *protocol.DispatchApproval
	checks       *protocol.DispatchChecks
	// found are violations found already while reading the request.
	found protocol.Violations
	// asReceived, when set, is the request body a refusal records.
	asReceived []byte
	// redrive: the ledger's own dispatch of a redrive's derived call, the
	// only one that may use a reserved id (protocol.ReservedCallID).
	redrive bool
	// api, when set, is the request on an API subject whose caller check
	// runs once the parts are read, before any other refusal.
	api *apiRequest
}

// dispatch validates and writes a dispatch.
func (l *Ledger) dispatch(ctx context.Context, by *protocol.Caller, in dispatchInput) (protocol.DispatchResult, error) {
	ctx, span := startRequestSpan(ctx, in.header, "cgledger.dispatch")
	res, err := l.dispatchTraced(ctx, by, in)
	endSpan(span, err)
	return res, err
}

func (l *Ledger) dispatchTraced(ctx context.Context, by *protocol.Caller, in dispatchInput) (protocol.DispatchResult, error) {
	subject, h, cardJSON, payloadJSON := in.subject, in.header, in.card, in.payload
	approval, checks, vs, asReceived := in.approval, in.checks, in.found, in.asReceived
	rawReq := func() protocol.RejectedRequest {
		if asReceived != nil {
			return protocol.NewRejectedRequest("", h, asReceived)
		}
		payloadJSON := payloadJSON
		if in.typedPayload != nil {
			// Only a refusal needs a typed payload's bytes (strings and
			// integers: the encoding cannot fail).
			payloadJSON, _ = json.Marshal(in.typedPayload)
		}
		b, _ := json.Marshal(protocol.DispatchBody{Subject: subject, Card: json.RawMessage(nonEmptyJSON(cardJSON)), Payload: json.RawMessage(nonEmptyJSON(payloadJSON)), Approval: approval, Checks: checks})
		return protocol.NewRejectedRequest("", h, b)
	}
	d := protocol.CheckDispatch(protocol.DispatchParts{Version: l.version, Subject: subject, Header: h, Card: cardJSON, Payload: payloadJSON,
		Identity: in.id, TypedPayload: in.typedPayload, Redrive: in.redrive}, &vs)
	sub, id, payload, card, cardBytes := d.Subject, d.Identity, d.Payload, d.Card, d.CardBytes
	// The caller check comes first, as it would before the parse: on what
	// the parse read when it read everything, else on the bytes.
	if err := l.callerChecked(ctx, in.api, func() protocol.Violations {
		if len(vs) > 0 {
			return in.api.bytesCaller()
		}
		return protocol.CheckDispatchCaller(in.api.c, sub.Project, card.ProjectID, id.AgentID)
	}); err != nil {
		return protocol.DispatchResult{}, err
	}
	// The checks asked for run with the other rules, so a refusal lists
	// every violation; a dispatch that asks for none pays nothing.
	var cvs protocol.Violations
	var unknownTool bool
	if checks != nil {
		var err error
		if cvs, unknownTool, err = l.dispatchChecks(ctx, checks, sub, card, payload.ToolName); err != nil {
			return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: checks: %w", id.AgentTurnID, id.ToolCallID, err)
		}
	}
	if len(vs) > 0 {
		vs = append(vs, cvs...)
		return protocol.DispatchResult{}, l.reject(ctx, by, protocol.OpDispatch, sub.Project, sub.Channel, protocol.NewError(protocol.CodeBadRequest, vs, "invalid dispatch: %d violation(s)", len(vs)), rawReq())
	}

	payloadBytes, err := json.Marshal(payload)
	if err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("dispatch: encode payload: %w", err)
	}
	if cardBytes == nil {
		// The decoder could not encode the card it read (never seen): its
		// own encoding error, as before.
		if cardBytes, err = json.Marshal(card); err != nil {
			return protocol.DispatchResult{}, fmt.Errorf("dispatch: encode card: %w", err)
		}
	}
	normSubject := sub.String()
	now := time.Now().UTC()
	// The tool's definition, read once (from memory after the first read):
	// it gives the call its deadline and, for a tool command, its pin.
	registered, err := l.registeredTool(ctx, sub.Project, payload.ToolName)
	if err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", id.AgentTurnID, id.ToolCallID, err)
	}
	budget := l.callBudget(registered, payload.ToolName, payload.TimeoutMS)
	rec := &protocol.CallRecord{
		State:          protocol.StateDispatched,
		CallID:         callIDOf(sub.Project, sub.Channel, id),
		StepID:         id.StepID,
		Subject:        normSubject,
		ToolName:       payload.ToolName,
		AfterExecution: payload.AfterExecution,
		ToolCallCardID: card.CardID,
		CardMetadata:   card.Metadata,
		DispatchedAt:   now,
		DeadlineUnixMS: now.Add(budget).UnixMilli(),
	}
	fpParts := []string{normSubject, id.AgentID, id.AgentTurnID, strconv.FormatUint(id.TurnEpoch, 10),
		id.ToolCallID, id.StepID, id.ContextBoxID, string(payloadBytes), string(cardBytes)}
	if approval != nil {
		// Only when given, so the fingerprints of earlier dispatches stand.
		fpParts = append(fpParts, "approval", strconv.FormatBool(approval.Required))
	}
	if checks != nil {
		// The same: only when given.
		fpParts = append(fpParts, "checks", strconv.FormatBool(checks.Registered), strconv.FormatBool(checks.Arguments))
	}
	rec.DispatchFingerprint = fingerprint(fpParts...)
	key := callKey(sub.Project, id.AgentTurnID, id.ToolCallID)
	if len(cvs) > 0 {
		// A repeat of a dispatch the ledger took (its tool since
		// unregistered, or its schema changed) is that dispatch's
		// duplicate, not a refusal: only a call not dispatched is refused.
		existing, _, err := l.getRecord(ctx, key)
		if err != nil {
			return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", id.AgentTurnID, id.ToolCallID, err)
		}
		if existing == nil || existing.DispatchFingerprint != rec.DispatchFingerprint {
			code, what := protocol.CodeBadRequest, "arguments do not match tool %s's parameters schema: %d violation(s)"
			if unknownTool {
				code, what = protocol.CodeNotFound, "tool %s is neither registered nor built in (%d violation(s))"
			}
			return protocol.DispatchResult{}, l.reject(ctx, by, protocol.OpDispatch, sub.Project, sub.Channel, protocol.NewError(code, cvs, what, payload.ToolName, len(cvs)), rawReq())
		}
	}
	if hold, timeoutMS := holdTerms(registered, approval); hold != nil {
		hold.BudgetMS, hold.Header, hold.Payload = budget.Milliseconds(), id.Header(), payloadBytes
		hold.ExpiresUnixMS = now.UnixMilli() + timeoutMS
		if hold.ArgumentsDigest, err = storedArgumentsDigest(cardBytes); err != nil {
			return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", id.AgentTurnID, id.ToolCallID, err)
		}
		rec.State, rec.DeadlineUnixMS, rec.Held = protocol.StateAwaitingApproval, 0, hold
	}

	// The card and the call record are independent writes: one round trip
	// for both. The command, which must never exist without them, waits.
	var put protocol.PutCardResult
	var putErr error
	putDone := make(chan struct{})
	go func() {
		defer close(putDone)
		put, putErr = l.putCard(ctx, by, protocol.OpDispatch, card, cardBytes, sub.Channel, rawReq)
	}()
	pinned := l.pinTool(sub, registered, rec)
	rev, created, existing, erev, err := l.createOrRead(ctx, key, rec)
	<-putDone
	if putErr != nil {
		if _, refused := protocol.AsError(putErr); refused && created {
			// The card can never be stored as given (its id holds another
			// card): take back the record this attempt created, so a
			// corrected dispatch of the call is not refused as a conflict.
			if derr := l.kv.Delete(context.WithoutCancel(ctx), key, jetstream.LastRevision(rev)); derr != nil {
				l.log.Warn("dispatch: remove the record of a refused dispatch", "key", key, "err", derr)
			}
			l.cache.records.drop(key)
		}
		return protocol.DispatchResult{}, putErr
	}
	if err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", id.AgentTurnID, id.ToolCallID, err)
	}
	if err := l.step(stepDispatchCard); err != nil {
		return protocol.DispatchResult{}, err
	}
	if created {
		if err := l.step(stepDispatchRecord); err != nil {
			return protocol.DispatchResult{}, err
		}
	} else {
		if existing.DispatchFingerprint != rec.DispatchFingerprint {
			var cvs protocol.Violations
			cvs.Add("header."+protocol.HeaderToolCallID, protocol.VConflict, "call %s of turn %s was already dispatched (epoch %d, card %s, subject %s) with different content", id.ToolCallID, id.AgentTurnID, existing.TurnEpoch, existing.ToolCallCardID, existing.Subject)
			return protocol.DispatchResult{}, l.reject(ctx, by, protocol.OpDispatch, sub.Project, sub.Channel, protocol.NewError(protocol.CodeConflict, cvs, "call %s already dispatched differently", id.ToolCallID), rawReq())
		}
		if existing.State == protocol.StatePaused {
			// Held by a pause: only a resume publishes its command.
			l.m.dupDispatches.Inc()
			return dispatchPausedAnswer(existing, put.Seq, true), nil
		}
		if existing.Held != nil && existing.CommandSeq == 0 {
			// Held: only an approval publishes its command.
			return l.dispatchHeld(ctx, by, existing, erev, put.Seq, false)
		}
		if existing.CommandSeq == 0 && existing.State == protocol.StateDispatched && existing.Paused == nil {
			// The bucket does not hold the command's sequence (issue 30):
			// the stream does, after the card, when it was published.
			withCard := cloneRecord(existing)
			withCard.CardSeq = put.Seq
			cmd, err := l.commandEntry(ctx, withCard, 0)
			if err != nil {
				return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", id.AgentTurnID, id.ToolCallID, err)
			}
			if cmd != nil {
				existing.CardSeq, existing.CommandSeq = put.Seq, cmd.Sequence
			}
		}
		if existing.CommandSeq != 0 {
			l.m.dupDispatches.Inc()
			return protocol.DispatchResult{Subject: existing.Subject, ToolCallCardID: existing.ToolCallCardID, CardSeq: existing.CardSeq, CommandSeq: existing.CommandSeq, Duplicate: true,
				ToolDefSeq: existing.ToolDefSeq, ToolVersion: existing.ToolVersion, DeadlineUnixMS: existing.DeadlineUnixMS}, nil
		}
		// A previous attempt stopped before publishing (or before recording
		// that it had): publish again; Nats-Msg-Id absorbs a recent duplicate.
		rec, rev = existing, erev
	}
	if created && rec.Held != nil {
		return l.dispatchHeld(ctx, by, rec, rev, put.Seq, true)
	}
	// Only the dispatch that created the call judges the tool's health: a
	// repeat may find the tool idle while the first one's command runs.
	var unavailable time.Duration
	if created {
		if unavailable, err = l.failFast(ctx, rec, pinned); err != nil {
			return protocol.DispatchResult{}, err
		}
	}

	// The command carries the deadline the record holds (a repeated
	// dispatch publishes the first one's), outside the fingerprint, which
	// identifies the request as the dispatcher made it.
	payload.DeadlineUnixMS = rec.DeadlineUnixMS
	cmdBytes, err := json.Marshal(payload)
	if err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("dispatch: encode command: %w", err)
	}
	msg := &nats.Msg{Subject: normSubject, Data: cmdBytes, Header: id.Header()}
	msg.Header.Set(protocol.HeaderMsgID, "cmd."+sub.Project+"."+id.AgentTurnID+"."+id.ToolCallID)
	// Every delivery of the command carries the call's idempotency key, for
	// tool services in any language (docs/protocol.md).
	msg.Header.Set(protocol.HeaderIdempotencyKey, protocol.IdempotencyKey(sub.Project, id.AgentTurnID, id.ToolCallID))
	// The append expects the tool's pause state it read: paused, the call
	// is held instead (its held entry carries the command a resume
	// publishes).
	ack, held, err := l.commandOrHold(ctx, by, rec, msg, rec.DeadlineUnixMS)
	if err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: publish command: %w", id.AgentTurnID, id.ToolCallID, err)
	}
	if held != nil {
		rec.CardSeq = put.Seq
		cur, err := l.holdDispatched(ctx, key, rec, rev, held)
		if err != nil {
			return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", id.AgentTurnID, id.ToolCallID, err)
		}
		if !created {
			l.m.dupDispatches.Inc()
		}
		return dispatchPausedAnswer(cur, put.Seq, !created), nil
	}
	if !ack.Duplicate {
		// The command's one append (a repeat within Nats-Msg-Id's window
		// is answered as a duplicate): the call is dispatched once, by
		// whichever dispatch published it.
		l.m.dispatches.WithLabelValues(l.callToolLabel(rec)).Inc()
	}
	if err := l.step(stepDispatchCommand); err != nil {
		return protocol.DispatchResult{}, err
	}
	// The record is not written again to hold the sequences (issue 30):
	// this process's executor and report read them from memory, a repeated
	// dispatch finds the command after its card in the stream
	// (commandEntry), and the report entry names the command when its
	// writer knows it.
	rec.CardSeq, rec.CommandSeq = put.Seq, ack.Sequence
	l.cacheRecord(key, rec, rev)
	if unavailable > 0 {
		// The command is in the ledger (the call's story reads as any
		// other's), and the call is answered at once: whoever pulls the
		// command later finds it answered.
		if err := l.answerUnavailable(ctx, rec, unavailable); err != nil {
			return protocol.DispatchResult{}, fmt.Errorf("dispatch %s/%s: %w", id.AgentTurnID, id.ToolCallID, err)
		}
	}
	// Whoever created the record dispatched the call; any other caller,
	// even one that finished publishing for it, repeated it.
	if !created {
		l.m.dupDispatches.Inc()
	}
	return protocol.DispatchResult{Subject: normSubject, ToolCallCardID: card.CardID, CardSeq: put.Seq, CommandSeq: ack.Sequence, Duplicate: !created,
		ToolDefSeq: rec.ToolDefSeq, ToolVersion: rec.ToolVersion, ToolUnavailable: unavailable > 0, DeadlineUnixMS: rec.DeadlineUnixMS}, nil
}

// callIDOf is the stored identity of the call of identity id dispatched in
// project, on channel.
func callIDOf(project, channel string, id protocol.Identity) protocol.CallID {
	return protocol.CallID{ProjectID: project, ChannelID: channel, AgentID: id.AgentID, AgentTurnID: id.AgentTurnID, TurnEpoch: id.TurnEpoch, ToolCallID: id.ToolCallID}
}

// registeredTool is the definition of tool registered in project now, or
// nil when none is (a built-in, a PMO command, a name nobody registered).
// Served from memory once read (toolCached), so the hot path gains no
// round trip.
func (l *Ledger) registeredTool(ctx context.Context, project, tool string) (*protocol.StoredTool, error) {
	if !protocol.ValidIdentifier(tool) {
		return nil, nil
	}
	st, err := l.toolCached(ctx, project, tool)
	if isCode(err, protocol.CodeNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read tool %s: %w", tool, err)
	}
	return st, nil
}

// pinTool fixes in rec the definition of the tool in force at dispatch,
// which every delivery of the call runs (CallRecord.ToolDefSeq). A tool
// command only; an unregistered tool pins nothing.
func (l *Ledger) pinTool(sub protocol.Subject, st *protocol.StoredTool, rec *protocol.CallRecord) *protocol.StoredTool {
	if sub.Kind != protocol.SubjectToolCommand || st == nil {
		return nil
	}
	rec.ToolDefSeq, rec.ToolVersion = st.Seq, st.Definition.Version
	l.labels.AddVersion(st.Definition.ToolName, st.Definition.Version)
	return st
}

// failFast is the tool's health.fail_fast_after_ms when no tool service
// pulled its commands for that long (the call is to be answered
// S-TOOL-UNAVAILABLE), else zero. Tools without the setting cost nothing.
func (l *Ledger) failFast(ctx context.Context, rec *protocol.CallRecord, pinned *protocol.StoredTool) (time.Duration, error) {
	if pinned == nil || pinned.Definition.Health == nil || pinned.Definition.Health.FailFastAfterMS <= 0 {
		return 0, nil
	}
	ff := time.Duration(pinned.Definition.Health.FailFastAfterMS) * time.Millisecond
	down, err := l.toolUnavailable(ctx, rec.Subject, pinned.Seq, ff)
	if err != nil {
		return 0, fmt.Errorf("dispatch %s/%s: tool health: %w", rec.AgentTurnID, rec.ToolCallID, err)
	}
	if !down {
		return 0, nil
	}
	return ff, nil
}

// callBudget is a call's time budget at dispatch: timeout_ms or the
// registered (else built-in) tool's default, capped at its maximum
// (protocol.CallTimeout).
func (l *Ledger) callBudget(registered *protocol.StoredTool, toolName string, requestedMS int64) time.Duration {
	def := l.builtin[toolName]
	if registered != nil {
		def = &registered.Definition
	}
	return protocol.CallTimeout(def, requestedMS)
}

// createOrRead creates the call record or, when it exists, reads it. The
// record can vanish between the two (a dispatch whose card was refused takes
// its record back): then the create is tried again.
func (l *Ledger) createOrRead(ctx context.Context, key string, rec *protocol.CallRecord) (rev uint64, created bool, existing *protocol.CallRecord, erev uint64, err error) {
	for range 8 {
		rev, created, err = l.createRecord(ctx, key, rec)
		if err != nil || created {
			return rev, created, nil, 0, err
		}
		if err := l.step(stepDispatchRecordExists); err != nil {
			return 0, false, nil, 0, err
		}
		existing, erev, err = l.readExisting(ctx, key)
		if err != nil {
			return 0, false, nil, 0, err
		}
		if existing != nil && existing.DispatchFingerprint != rec.DispatchFingerprint {
			// Another dispatch of the call: a real one (a conflict), or
			// one being refused, whose record is about to go.
			if existing, erev, err = l.settleForeign(ctx, key, existing, erev); err != nil {
				return 0, false, nil, 0, err
			}
		}
		if existing != nil {
			return 0, false, existing, erev, nil
		}
	}
	return 0, false, nil, 0, fmt.Errorf("call record %s: created and removed again too often", key)
}

// settleForeign waits, briefly, to tell a record written by another,
// different dispatch of the call apart from the leftover of a refused one:
// it returns the record once its dispatch is confirmed (a conflict), or nil
// once it is gone; a leftover whose card id holds another card is removed
// here (at its revision) rather than waited for.
func (l *Ledger) settleForeign(ctx context.Context, key string, rec *protocol.CallRecord, rev uint64) (*protocol.CallRecord, uint64, error) {
	for range 100 {
		confirmed, stored, err := l.dispatchConfirmed(ctx, rec)
		if err != nil || confirmed {
			return rec, rev, err
		}
		if stored {
			if err := l.kv.Delete(ctx, key, jetstream.LastRevision(rev)); err == nil {
				l.cache.records.drop(key)
				return nil, 0, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("call record %s: waiting for another dispatch of the call: %w", key, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
		if rec, rev, err = l.getRecord(ctx, key); err != nil || rec == nil {
			return nil, 0, err
		}
	}
	// Still unconfirmed after a second: treat it as the dispatch it claims
	// to be.
	return rec, rev, nil
}

// readExisting reads a record whose create just failed because it exists.
// On a replicated bucket the read can reach a replica that has not applied
// the create yet, so it retries for a moment; a record still absent after
// that was removed (nil, and no error).
func (l *Ledger) readExisting(ctx context.Context, key string) (*protocol.CallRecord, uint64, error) {
	deadline := time.Now().Add(250 * time.Millisecond)
	for wait := backoff.New(time.Millisecond, 50*time.Millisecond); ; {
		rec, rev, err := l.getRecord(ctx, key)
		if err == nil && rec != nil {
			return rec, rev, nil
		}
		if err == nil && !time.Now().Before(deadline) {
			return nil, 0, nil
		}
		if werr := wait.Wait(ctx); werr != nil {
			return nil, 0, fmt.Errorf("call record exists but cannot be read (last: %v): %w", err, werr)
		}
	}
}

// recordSequences stores the card's and the command's sequences in the call
// record, starting from revision rev. A report may already have moved the
// record on (the executor can be that fast), so a lost compare-and-set
// re-reads and sets them on what it finds.
func (l *Ledger) recordSequences(ctx context.Context, key string, want *protocol.CallRecord, rev uint64) error {
	rec := cloneRecord(want)
	for range 16 {
		_, ok, err := l.updateRecord(ctx, key, rec, rev)
		if err != nil || ok {
			return err
		}
		cur, crev, err := l.getRecord(ctx, key)
		if err != nil {
			return err
		}
		if cur == nil {
			return fmt.Errorf("call record %s vanished", key)
		}
		if cur.CommandSeq != 0 {
			return nil
		}
		rec, rev = cur, crev
		rec.CardSeq, rec.CommandSeq = want.CardSeq, want.CommandSeq
	}
	return fmt.Errorf("call record %s: too many concurrent updates", key)
}

func nonEmptyJSON(b []byte) []byte {
	if len(b) == 0 || !json.Valid(b) {
		if len(b) == 0 {
			return []byte("null")
		}
		s, _ := json.Marshal(string(b))
		return s
	}
	return b
}
