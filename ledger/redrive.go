package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// Redrive (docs/operations.md, "Redrive"; docs/decisions.md, "Redrive: a
// derived call under the same identity"): an admin runs a failed or
// timed-out call again as the derived call <root>~r<n>, under the same
// identity and idempotency key. The redrive entry, written first, carries
// the derived call's whole dispatch; the ordinary dispatch then runs it, so
// pause, approval, fail-fast and idempotent repeats apply to it unchanged.

// Redrive runs a failed or timed-out call again as a derived call
// (call.redrive). actor is the admin's actor token, recorded as the entry's
// CG-Actor and in the entry.
func (l *Ledger) Redrive(ctx context.Context, actor string, req protocol.RedriveRequest) (res protocol.RedriveResult, err error) {
	by := atEdge(ctx, req.ProjectID, actor)
	if !operatorCertain(actor, req.ProjectID, req.AgentTurnID, req.ToolCallID, req.Reason) {
		return viaWire(ctx, protocol.OpCallRedrive, req, func(ctx context.Context, body []byte) (protocol.RedriveResult, error) {
			return l.redriveJSON(ctx, by, actor, body)
		})
	}
	defer func() { l.countOperatorAction(protocol.OpCallRedrive, err) }()
	return l.redrive(ctx, by, actor, req, rawOf(req))
}

// redriveJSON redrives a call for actor, or refuses (and records) the
// request listing every violation: bad_request, unknown_call, or conflict
// (no report, a report that is not failed or timeout, a denied approval, a
// side_effectful call whose effect may have applied, a derived id that
// does not fit, or a redrive stored already: named). The same actor and
// reason again answers the stored redrive, after finishing its dispatch.
func (l *Ledger) redriveJSON(ctx context.Context, by *protocol.Caller, actor string, body []byte) (res protocol.RedriveResult, err error) {
	defer func() { l.countOperatorAction(protocol.OpCallRedrive, err) }()
	req, vs := protocol.ParseRedriveRequest(body)
	raw := rawBody(body)
	if err := l.refuseOperator(ctx, by, protocol.OpCallRedrive, actor, req.ProjectID, vs, raw); err != nil {
		return res, err
	}
	return l.redrive(ctx, by, actor, req, raw)
}

// redrive is the one core of call.redrive, typed or received: req is
// valid, actor is a valid token, raw is the request a refusal records.
func (l *Ledger) redrive(ctx context.Context, by *protocol.Caller, actor string, req protocol.RedriveRequest, raw func() protocol.RejectedRequest) (res protocol.RedriveResult, err error) {
	op := protocol.OpCallRedrive
	rec, err := l.cancelTarget(ctx, by, op, req.ProjectID, req.AgentTurnID, req.ToolCallID, raw)
	if err != nil {
		return res, err
	}
	var vs protocol.Violations
	wrap := func(err error) error { return fmt.Errorf("%s %s/%s: %w", op, rec.AgentTurnID, rec.ToolCallID, err) }
	refuse := func(vs protocol.Violations) error {
		return l.reject(ctx, by, op, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeConflict, vs, "call %s cannot be redriven", rec.ToolCallID), raw())
	}
	prior, err := l.redriveOf(ctx, rec)
	if err != nil {
		return res, wrap(err)
	}
	if prior != nil {
		if prior.Actor == actor && prior.Reason == req.Reason {
			return l.finishRedrive(ctx, prior, true)
		}
		addRedriven(&vs, rec.ToolCallID, prior)
	}
	e, err := l.redriveTerms(ctx, rec, &vs)
	if err != nil {
		return res, wrap(err)
	}
	if len(vs) > 0 {
		return res, refuse(vs)
	}
	e.Actor, e.Reason, e.RedrivenUnixMS = actor, req.Reason, time.Now().UnixMilli()
	data, err := json.Marshal(e)
	if err != nil {
		return res, wrap(fmt.Errorf("encode entry: %w", err))
	}
	msg := &nats.Msg{Subject: protocol.RedriveSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID), Data: data, Header: approvalHeader(rec)}
	// This redrive's own id (a resend of it is one entry): one shared by
	// every redrive of the call would answer a racing, different one as a
	// duplicate instead of refusing it.
	msg.Header.Set(protocol.HeaderMsgID, fmt.Sprintf("redrive.%s.%s.%s.%s.%d", rec.ProjectID, rec.AgentTurnID, rec.ToolCallID, actor, e.RedrivenUnixMS))
	ack, err := l.appendEntry(ctx, by, protocol.KindRedrive, msg, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case err == nil && !ack.Duplicate:
		e.Seq = ack.Sequence
		l.log.Info("operator redrove call", "project", rec.ProjectID, "turn", rec.AgentTurnID, "call", rec.ToolCallID, "redrive_call", e.RedriveCallID, "actor", actor, "seq", ack.Sequence)
	case err == nil || isWrongLastSeq(err):
		// Another redrive was stored first (or, a duplicate of the message
		// id, one by the same actor in the same millisecond): the same one
		// (a resend whose answer was lost) is answered; a different one
		// refuses this.
		won, err := l.redriveOf(ctx, rec)
		if err != nil {
			return res, wrap(fmt.Errorf("read the redrive that was stored first: %w", err))
		}
		if won == nil {
			return res, wrap(errors.New("a redrive was stored first, and none is found"))
		}
		if won.Actor == actor && won.Reason == req.Reason {
			return l.finishRedrive(ctx, won, true)
		}
		var cvs protocol.Violations
		addRedriven(&cvs, rec.ToolCallID, won)
		return res, refuse(cvs)
	default:
		return res, wrap(fmt.Errorf("append: %w", err))
	}
	if err := l.step(stepRedriveEntry); err != nil {
		return res, err
	}
	return l.finishRedrive(ctx, e, false)
}

// addRedriven lists the redrive stored for a call as a conflict.
func addRedriven(vs *protocol.Violations, callID string, prior *protocol.RedriveEntry) {
	vs.Add("body.tool_call_id", protocol.VConflict, "call %s was already redriven as %s by %s at %s (seq %d): a call is redriven once; redrive %s if it failed too",
		callID, prior.RedriveCallID, prior.Actor, protocol.FormatTime(time.UnixMilli(prior.RedrivenUnixMS)), prior.Seq, prior.RedriveCallID)
}

// finishRedrive dispatches a stored redrive's derived call (idempotent: a
// dispatch done already is answered as a duplicate) and answers the
// redrive.
func (l *Ledger) finishRedrive(ctx context.Context, e *protocol.RedriveEntry, duplicate bool) (protocol.RedriveResult, error) {
	d, err := l.dispatchRedrive(ctx, e)
	if err != nil {
		return protocol.RedriveResult{}, err
	}
	return protocol.RedriveResult{Seq: e.Seq, RedriveCallID: e.RedriveCallID, RedriveCardID: e.RedriveCardID, Dispatch: d, Duplicate: duplicate}, nil
}

// dispatchRedrive runs the dispatch a redrive entry stores, as the ledger's
// own (no caller's actor on its entries), which alone may use a reserved id.
func (l *Ledger) dispatchRedrive(ctx context.Context, e *protocol.RedriveEntry) (protocol.DispatchResult, error) {
	d := e.Dispatch
	card, err := json.Marshal(d.Card)
	if err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("redrive %s/%s: encode card: %w", e.AgentTurnID, e.RedriveCallID, err)
	}
	payload, err := json.Marshal(d.Payload)
	if err != nil {
		return protocol.DispatchResult{}, fmt.Errorf("redrive %s/%s: encode payload: %w", e.AgentTurnID, e.RedriveCallID, err)
	}
	res, err := l.dispatch(ctx, nil, dispatchInput{subject: d.Subject, header: nats.Header(d.Header), card: card, payload: payload, approval: d.Approval, redrive: true})
	if err != nil {
		return res, fmt.Errorf("redrive %s/%s: dispatch the derived call %s: %w", e.AgentTurnID, e.ToolCallID, e.RedriveCallID, err)
	}
	return res, nil
}

// redriveOf reads a call's redrive (Seq set): nil when none is stored.
func (l *Ledger) redriveOf(ctx context.Context, rec *protocol.CallRecord) (*protocol.RedriveEntry, error) {
	m, err := l.lastForSubject(ctx, protocol.RedriveSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil || m == nil {
		return nil, err
	}
	var e protocol.RedriveEntry
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return nil, fmt.Errorf("decode redrive entry %d: %w", m.Sequence, err)
	}
	e.Seq = m.Sequence
	return &e, nil
}

// redriveTerms judges whether rec may be redriven, adding a violation for
// each reason it may not, and builds the entry of its redrive (everything
// but the actor, reason and time).
func (l *Ledger) redriveTerms(ctx context.Context, rec *protocol.CallRecord, vs *protocol.Violations) (*protocol.RedriveEntry, error) {
	const field = "body.tool_call_id"
	e := &protocol.RedriveEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID,
		TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, ToolName: rec.ToolName,
		IdempotencyKey: protocol.IdempotencyKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)}
	derived, fits := protocol.RedriveCallID(rec.ToolCallID)
	if !fits {
		vs.Add(field, protocol.VTooLarge, "the derived call's id %s would be longer than %d bytes", protocol.Clip(derived), protocol.MaxIdentifierLen)
	}
	e.RedriveCallID = derived
	cardID := redriveCardID(rec, derived)
	if !protocol.ValidIdentifier(cardID) {
		vs.Add(field, protocol.VTooLarge, "the derived call's tool.call card id %s would be longer than %d bytes", protocol.Clip(cardID), protocol.MaxIdentifierLen)
	}
	e.RedriveCardID = cardID

	m, err := l.lastForSubject(ctx, protocol.ReportSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil {
		return nil, err
	}
	if m == nil {
		vs.Add(field, protocol.VConflict, "call %s has no report yet (state %s): only a call reported failed or timeout can be redriven", rec.ToolCallID, rec.State)
		return e, nil
	}
	var report protocol.ReportEntry
	if err := json.Unmarshal(m.Data, &report); err != nil {
		return nil, fmt.Errorf("decode report entry %d: %w", m.Sequence, err)
	}
	e.ReportSeq, e.Status = m.Sequence, report.Status
	if report.Status != protocol.StatusFailed && report.Status != protocol.StatusTimeout {
		vs.Add(field, protocol.VConflict, "call %s's report (seq %d) is %s: only a call reported failed or timeout can be redriven", rec.ToolCallID, m.Sequence, report.Status)
		return e, nil
	}
	card, err := l.GetCard(ctx, rec.ProjectID, report.ToolResultCardID)
	if err != nil {
		return nil, fmt.Errorf("result card %s: %w", report.ToolResultCardID, err)
	}
	e.TaxonomyCode = taxonomyCode(&card.Card)
	if rec.Held != nil {
		decided, seq, err := l.decisionOf(ctx, rec)
		if err != nil {
			return nil, err
		}
		if decided != nil && decided.Decision == protocol.ApprovalDenied {
			vs.Add(field, protocol.VConflict, "call %s's approval was denied by %s (seq %d): a person's decision is not overridden by a redrive", rec.ToolCallID, decided.Approver, seq)
		}
	}
	if e.Determinism, err = l.callDeterminism(ctx, rec); err != nil {
		return nil, err
	}
	unknown := false
	if e.Determinism == protocol.DeterminismSideEffectful {
		if unknown, err = l.effectUnknown(ctx, rec, report.Status, e.TaxonomyCode, e.Determinism); err != nil {
			return nil, err
		}
	}
	if unknown {
		res, err := l.resolutionOf(ctx, rec)
		if err != nil {
			return nil, err
		}
		what := "failed with " + protocol.CodeToolOutcomeUnknown
		if report.Status == protocol.StatusTimeout {
			what = "timeout, with an attempt on record"
		}
		switch {
		case res == nil:
			vs.Add(field, protocol.VConflict, "call %s is to side_effectful tool %s and its report (seq %d) is %s: its side effect may have applied; if it did not, say so first (call.resolve not_applied)", rec.ToolCallID, rec.ToolName, m.Sequence, what)
		case res.Effect != protocol.EffectNotApplied:
			vs.Add(field, protocol.VConflict, "call %s is to side_effectful tool %s and was resolved %s by %s (seq %d): its side effect took place, and a redrive would repeat it", rec.ToolCallID, rec.ToolName, res.Effect, res.Actor, res.Seq)
		default:
			e.ResolutionSeq = res.Seq
		}
	}
	if len(*vs) > 0 {
		return e, nil
	}
	commandSeq := report.CommandSeq
	if commandSeq == 0 {
		commandSeq = rec.CommandSeq
	}
	if e.Dispatch, err = l.redriveDispatchOf(ctx, rec, commandSeq, derived, cardID, vs); err != nil {
		return nil, err
	}
	return e, nil
}

// redriveCardID is the derived call's tool.call card id: the original
// card's root id (its own redrive suffix, for a derived call, taken off)
// with the derived call's number.
func redriveCardID(rec *protocol.CallRecord, derived string) string {
	_, n, _ := protocol.RedriveOrigin(derived)
	root := rec.ToolCallCardID
	if _, m, ok := protocol.RedriveOrigin(rec.ToolCallID); ok {
		if r, k, ok := protocol.RedriveOrigin(root); ok && k == m {
			root = r
		}
	}
	return root + protocol.RedriveSeparator + strconv.Itoa(n)
}

// callDeterminism is the determinism of a call's tool: its pinned
// definition's, else the one registered now, else the built-in's. A tool
// nobody defined is taken as side_effectful, the default of a definition
// that says nothing.
func (l *Ledger) callDeterminism(ctx context.Context, rec *protocol.CallRecord) (string, error) {
	def := l.builtin[rec.ToolName]
	st, err := l.registeredTool(ctx, rec.ProjectID, rec.ToolName)
	if err != nil {
		return "", err
	}
	if rec.ToolDefSeq != 0 && (st == nil || st.Seq != rec.ToolDefSeq) {
		if st, err = l.GetToolAt(ctx, rec.ProjectID, rec.ToolName, rec.ToolDefSeq); err != nil {
			return "", fmt.Errorf("read the pinned definition of %s: %w", rec.ToolName, err)
		}
	}
	if st != nil {
		def = &st.Definition
	}
	if def == nil || def.Determinism == "" {
		return protocol.DeterminismSideEffectful, nil
	}
	return def.Determinism, nil
}

// redriveDispatchOf builds the derived call's dispatch from the original's:
// its command entry's (commandSeq: the report's, else the record's)
// identity and payload (or, for a call whose command was never published,
// those its record held), its tool.call card under
// the derived ids, and its own ask for approval. A card id taken by
// another card is listed in vs.
func (l *Ledger) redriveDispatchOf(ctx context.Context, rec *protocol.CallRecord, commandSeq uint64, derived, cardID string, vs *protocol.Violations) (protocol.RedriveDispatch, error) {
	var d protocol.RedriveDispatch
	var header nats.Header
	var payloadJSON []byte
	cmd, err := l.commandEntry(ctx, rec, commandSeq)
	if err != nil {
		return d, err
	}
	switch {
	case cmd != nil:
		header, payloadJSON = cmd.Header, cmd.Data
	case rec.Paused != nil:
		header, payloadJSON = nats.Header(rec.Paused.Header), rec.Paused.Payload
	case rec.Held != nil:
		header, payloadJSON = nats.Header(rec.Held.Header), rec.Held.Payload
	default:
		return d, fmt.Errorf("call %s has neither a command nor a held one to redrive", rec.ToolCallID)
	}
	id, hvs := protocol.ParseIdentity(header, protocol.IdentityRules{RequireToolCallID: true})
	if len(hvs) > 0 {
		return d, fmt.Errorf("the original command's identity does not read: %v", hvs)
	}
	// The derived call's own trace: the redrive is a new request.
	id.ToolCallID, id.Traceparent, id.Tracestate = derived, "", ""
	if err := json.Unmarshal(payloadJSON, &d.Payload); err != nil {
		return d, fmt.Errorf("decode the original command: %w", err)
	}
	d.Payload.DeadlineUnixMS, d.Payload.ToolCallCardID = 0, cardID
	d.Subject, d.Header = rec.Subject, id.Header()
	stored, err := l.GetCard(ctx, rec.ProjectID, rec.ToolCallCardID)
	if err != nil {
		return d, fmt.Errorf("tool.call card %s: %w", rec.ToolCallCardID, err)
	}
	d.Card = stored.Card
	d.Card.CardID, d.Card.ToolCallID = cardID, derived
	if taken, err := l.GetCard(ctx, rec.ProjectID, cardID); err == nil {
		// Only the very card this redrive writes lets its dispatch
		// succeed: any other under the id (even one naming the derived
		// call) would leave a stored redrive whose dispatch is refused.
		same, err := sameCard(&taken.Card, &d.Card)
		if err != nil {
			return d, fmt.Errorf("card %s: %w", cardID, err)
		}
		if !same {
			vs.Add("body.tool_call_id", protocol.VConflict, "the derived call's card id %s holds another card already (a %s card of call %s in turn %s, seq %d)", cardID, taken.Card.Type, taken.Card.ToolCallID, taken.Card.AgentTurnID, taken.Seq)
		}
	} else if !isCode(err, protocol.CodeUnknownCard) {
		return d, fmt.Errorf("card %s: %w", cardID, err)
	}
	if rec.Held != nil && rec.Held.RequestedBy == protocol.ApprovalRequestedByWorker {
		d.Approval = &protocol.DispatchApproval{Required: true}
	}
	return d, nil
}

// commandEntry reads a call's command entry: at seq when known; else
// (the record does not hold its sequence yet, or the process that
// published it stopped before writing it) the first entry on the call's
// command subject after its tool.call card that names the call. Nil when
// the call has none (held, or paused, before any command).
func (l *Ledger) commandEntry(ctx context.Context, rec *protocol.CallRecord, seq uint64) (*jetstream.RawStreamMsg, error) {
	if seq != 0 {
		m, err := l.stream.GetMsg(ctx, seq)
		if err != nil {
			return nil, fmt.Errorf("read command entry %d: %w", seq, err)
		}
		return m, nil
	}
	from := rec.CardSeq
	if from == 0 {
		card, err := l.firstForSubject(ctx, protocol.CardSubject(l.version, rec.ProjectID, rec.ToolCallCardID))
		if err != nil {
			return nil, fmt.Errorf("read tool.call card %s: %w", rec.ToolCallCardID, err)
		}
		if card == nil {
			return nil, nil
		}
		from = card.Sequence
	}
	// Bounded: the command follows its card closely; a call whose command
	// is not among the next entries of its subject has none.
	for range 10_000 {
		m, err := l.stream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(rec.Subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("find the command of call %s: %w", rec.ToolCallID, err)
		}
		if protocol.HeaderGet(m.Header, protocol.HeaderAgentTurnID) == rec.AgentTurnID && protocol.HeaderGet(m.Header, protocol.HeaderToolCallID) == rec.ToolCallID {
			return m, nil
		}
		from = m.Sequence + 1
	}
	return nil, fmt.Errorf("find the command of call %s: not among the 10000 entries of %s after its card", rec.ToolCallID, rec.Subject)
}

// callRedrive fills a call view's redrive: only a failed or timed-out call
// can have one, so no other call.get pays the read.
func (l *Ledger) callRedrive(ctx context.Context, rec *protocol.CallRecord) (*protocol.RedriveEntry, error) {
	if rec.Claim == nil || (rec.Claim.Status != protocol.StatusFailed && rec.Claim.Status != protocol.StatusTimeout) {
		return nil, nil
	}
	return l.redriveOf(ctx, rec)
}

// RedriveOf reads a call's redrive (call.get's redrive), with its entry's
// seq: nil when the call has none.
func (l *Ledger) RedriveOf(ctx context.Context, project, turnID, callID string) (*protocol.RedriveEntry, error) {
	rec, err := l.GetCall(ctx, project, turnID, callID)
	if err != nil {
		return nil, err
	}
	return l.callRedrive(ctx, rec)
}

// sameCard reports whether two cards are stored alike (their normalized
// JSON, as putCard compares them).
func sameCard(a, b *protocol.Card) (bool, error) {
	ja, err := json.Marshal(a)
	if err != nil {
		return false, fmt.Errorf("encode card: %w", err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return false, fmt.Errorf("encode card: %w", err)
	}
	return string(ja) == string(jb), nil
}
