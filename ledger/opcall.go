package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// Operator actions on calls (docs/operations.md, "Operator actions"): an
// admin's cancel of any agent's call (call.cancel) and its resolution of an
// outcome_unknown call (call.resolve). Each is an entry carrying the
// admin's actor (CG-Actor) and reason; each refusal is recorded.

// OperatorCancel cancels any agent's call for an operator (call.cancel):
// the call's cancel entry, or, for a call held for approval, the decision
// canceled (with actor as its approver). actor is the admin's actor token,
// recorded as the entry's CG-Actor. A reported call is refused conflict.
func (l *Ledger) OperatorCancel(ctx context.Context, actor string, req protocol.OperatorCancelRequest) (res protocol.OperatorCancelResult, err error) {
	by := atEdge(ctx, req.ProjectID, actor)
	if !operatorCertain(actor, req.ProjectID, req.AgentTurnID, req.ToolCallID, req.Reason) {
		return viaWire(ctx, protocol.OpCallCancel, req, func(ctx context.Context, body []byte) (protocol.OperatorCancelResult, error) {
			return l.operatorCancelJSON(ctx, by, actor, body)
		})
	}
	defer func() { l.countOperatorAction(protocol.OpCallCancel, err) }()
	return l.operatorCancel(ctx, by, actor, req, rawOf(req))
}

// Resolve records an operator's statement of what became of the side
// effect of a call whose report is failed with S-TOOL-OUTCOME-UNKNOWN
// (call.resolve): one resolution entry per call, which changes no report.
// actor is the admin's actor token, recorded as the entry's CG-Actor and
// in the entry.
func (l *Ledger) Resolve(ctx context.Context, actor string, req protocol.ResolveRequest) (res protocol.ResolveResult, err error) {
	by := atEdge(ctx, req.ProjectID, actor)
	if !operatorCertain(actor, req.ProjectID, req.AgentTurnID, req.ToolCallID, req.Reason) ||
		(req.Effect != protocol.EffectApplied && req.Effect != protocol.EffectNotApplied) {
		return viaWire(ctx, protocol.OpCallResolve, req, func(ctx context.Context, body []byte) (protocol.ResolveResult, error) {
			return l.resolveJSON(ctx, by, actor, body)
		})
	}
	defer func() { l.countOperatorAction(protocol.OpCallResolve, err) }()
	return l.resolve(ctx, by, actor, req, rawOf(req))
}

// operatorCertain reports whether an operator action on a call is
// certainly valid: what the API's parser would read back from its JSON with
// no violation, by an actor token checkActor accepts.
func operatorCertain(actor, project, turn, call, reason string) bool {
	ident := protocol.ValidIdentifier
	return ident(actor) && ident(project) && ident(turn) && ident(call) &&
		certainText(reason, protocol.MaxOperatorReasonBytes, true)
}

// countOperatorAction counts an answered operator action: ok, or refused
// (a protocol refusal, which is recorded). A failure to answer at all is
// neither: the operator retries it.
func (l *Ledger) countOperatorAction(op string, err error) {
	switch _, refused := protocol.AsError(err); {
	case err == nil:
		l.m.operatorActions.WithLabelValues(op, "ok").Inc()
	case refused:
		l.m.operatorActions.WithLabelValues(op, "refused").Inc()
	}
}

// refuseOperator finishes the check of a received operator action: the
// actor token beside the body's violations vs, refused bad_request listing
// them all (and recorded, raw being the request as received), or nil.
func (l *Ledger) refuseOperator(ctx context.Context, by *protocol.Caller, op, actor, project string, vs protocol.Violations, raw func() protocol.RejectedRequest) error {
	checkActor(&vs, actor)
	if len(vs) > 0 {
		return l.reject(ctx, by, op, project, protocol.Unrouted, protocol.NewError(protocol.CodeBadRequest, vs, "invalid %s: %d violation(s)", op, len(vs)), raw())
	}
	return nil
}

// checkActor lists the actor token's problem, if any.
func checkActor(vs *protocol.Violations, actor string) {
	if !protocol.ValidIdentifier(actor) {
		vs.Add("actor", protocol.VInvalidToken, "actor %q (the admin's actor token) is not an identifier", protocol.Clip(actor))
	}
}

// operatorCancelJSON cancels a call for actor, or refuses (and records)
// the request listing every violation: bad_request, unknown_call, or
// conflict (the call is reported already).
func (l *Ledger) operatorCancelJSON(ctx context.Context, by *protocol.Caller, actor string, body []byte) (res protocol.OperatorCancelResult, err error) {
	defer func() { l.countOperatorAction(protocol.OpCallCancel, err) }()
	req, vs := protocol.ParseOperatorCancelRequest(body)
	raw := rawBody(body)
	if err := l.refuseOperator(ctx, by, protocol.OpCallCancel, actor, req.ProjectID, vs, raw); err != nil {
		return res, err
	}
	return l.operatorCancel(ctx, by, actor, req, raw)
}

// operatorCancel is the one core of call.cancel, typed or received: req is
// valid, actor is a valid token, raw is the request a refusal records.
func (l *Ledger) operatorCancel(ctx context.Context, by *protocol.Caller, actor string, req protocol.OperatorCancelRequest, raw func() protocol.RejectedRequest) (res protocol.OperatorCancelResult, err error) {
	rec, err := l.cancelTarget(ctx, by, protocol.OpCallCancel, req.ProjectID, req.AgentTurnID, req.ToolCallID, raw)
	if err != nil {
		return res, err
	}
	res, err = l.cancelCall(ctx, by, protocol.OpCallCancel, rec, actor, req.Reason, raw)
	if err == nil && !res.Duplicate {
		l.log.Info("operator canceled call", "project", rec.ProjectID, "turn", rec.AgentTurnID, "call", rec.ToolCallID, "agent", rec.AgentID, "actor", actor, "entry", res.Entry, "seq", res.Seq)
	}
	return res, err
}

// resolveJSON resolves a call for actor, or refuses (and records) the
// request listing every violation: bad_request, unknown_call, or conflict
// (the call has no report, its report is not failed with
// S-TOOL-OUTCOME-UNKNOWN, or it is resolved already: the resolution named).
// The same resolution sent again (same effect, actor and reason) is
// answered with the stored one.
func (l *Ledger) resolveJSON(ctx context.Context, by *protocol.Caller, actor string, body []byte) (res protocol.ResolveResult, err error) {
	defer func() { l.countOperatorAction(protocol.OpCallResolve, err) }()
	req, vs := protocol.ParseResolveRequest(body)
	raw := rawBody(body)
	if err := l.refuseOperator(ctx, by, protocol.OpCallResolve, actor, req.ProjectID, vs, raw); err != nil {
		return res, err
	}
	return l.resolve(ctx, by, actor, req, raw)
}

// resolve is the one core of call.resolve, typed or received: req is
// valid, actor is a valid token, raw is the request a refusal records.
func (l *Ledger) resolve(ctx context.Context, by *protocol.Caller, actor string, req protocol.ResolveRequest, raw func() protocol.RejectedRequest) (res protocol.ResolveResult, err error) {
	op := protocol.OpCallResolve
	rec, err := l.cancelTarget(ctx, by, op, req.ProjectID, req.AgentTurnID, req.ToolCallID, raw)
	if err != nil {
		return res, err
	}
	var vs protocol.Violations
	wrap := func(err error) error { return fmt.Errorf("%s %s/%s: %w", op, rec.AgentTurnID, rec.ToolCallID, err) }
	refuse := func(vs protocol.Violations, format string, args ...any) error {
		return l.reject(ctx, by, op, rec.ProjectID, rec.ChannelID, protocol.NewError(protocol.CodeConflict, vs, format, args...), raw())
	}
	subj := protocol.ResolutionSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
	prior, err := l.resolutionOf(ctx, rec)
	if err != nil {
		return res, wrap(err)
	}
	if prior != nil {
		if prior.Effect == req.Effect && prior.Actor == actor && prior.Reason == req.Reason {
			return protocol.ResolveResult{Seq: prior.Seq, Effect: prior.Effect}, nil
		}
		vs.Add("body.tool_call_id", protocol.VConflict, "call %s was already resolved: %s by %s at %s (seq %d)", rec.ToolCallID, prior.Effect, prior.Actor, protocol.FormatTime(time.UnixMilli(prior.ResolvedUnixMS)), prior.Seq)
	}
	report, why, err := l.outcomeUnknownReport(ctx, rec)
	if err != nil {
		return res, wrap(err)
	}
	if why != "" {
		vs.Add("body.tool_call_id", protocol.VConflict, "%s", why)
	}
	if len(vs) > 0 {
		return res, refuse(vs, "call %s cannot be resolved", rec.ToolCallID)
	}
	e := protocol.ResolutionEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID,
		TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, ToolName: rec.ToolName, Effect: req.Effect, Actor: actor, Reason: req.Reason,
		ReportSeq: report.Sequence, ToolResultCardID: report.cardID, ResolvedUnixMS: time.Now().UnixMilli()}
	data, err := json.Marshal(e)
	if err != nil {
		return res, wrap(fmt.Errorf("encode entry: %w", err))
	}
	msg := &nats.Msg{Subject: subj, Data: data, Header: approvalHeader(rec)}
	// This resolution's own id (a resend of it is one entry): one shared by
	// every resolution of the call would answer a racing, different one as
	// a duplicate instead of refusing it.
	msg.Header.Set(protocol.HeaderMsgID, fmt.Sprintf("resolution.%s.%s.%s.%s.%s.%d", rec.ProjectID, rec.AgentTurnID, rec.ToolCallID, req.Effect, actor, e.ResolvedUnixMS))
	ack, err := l.appendEntry(ctx, by, protocol.KindResolution, msg, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case err == nil:
		l.log.Info("operator resolved call", "project", rec.ProjectID, "turn", rec.AgentTurnID, "call", rec.ToolCallID, "effect", req.Effect, "actor", actor, "seq", ack.Sequence)
		return protocol.ResolveResult{Seq: ack.Sequence, Effect: req.Effect}, nil
	case isWrongLastSeq(err):
		// Another resolution won the race: this one is refused, naming it.
		won, err := l.resolutionOf(ctx, rec)
		if err != nil {
			return res, wrap(fmt.Errorf("read the resolution that was stored first: %w", err))
		}
		if won == nil {
			return res, wrap(errors.New("a resolution was stored first, and none is found"))
		}
		vs.Add("body.tool_call_id", protocol.VConflict, "call %s was already resolved: %s by %s at %s (seq %d)", rec.ToolCallID, won.Effect, won.Actor, protocol.FormatTime(time.UnixMilli(won.ResolvedUnixMS)), won.Seq)
		return res, refuse(vs, "call %s cannot be resolved", rec.ToolCallID)
	default:
		return res, wrap(fmt.Errorf("append: %w", err))
	}
}

// resolutionOf reads a call's resolution (Seq set): nil when none is stored.
func (l *Ledger) resolutionOf(ctx context.Context, rec *protocol.CallRecord) (*protocol.ResolutionEntry, error) {
	m, err := l.lastForSubject(ctx, protocol.ResolutionSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil || m == nil {
		return nil, err
	}
	var e protocol.ResolutionEntry
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return nil, fmt.Errorf("decode resolution entry %d: %w", m.Sequence, err)
	}
	e.Seq = m.Sequence
	return &e, nil
}

// storedReport is a call's report entry and its result card's id.
type storedReport struct {
	Sequence uint64
	cardID   string
}

// outcomeUnknownReport reads the call's report and says why it may not be
// resolved ("" when it may): the call has no report, or its report leaves
// its effect known (effectUnknown).
func (l *Ledger) outcomeUnknownReport(ctx context.Context, rec *protocol.CallRecord) (storedReport, string, error) {
	m, err := l.lastForSubject(ctx, protocol.ReportSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil {
		return storedReport{}, "", err
	}
	if m == nil {
		return storedReport{}, fmt.Sprintf("call %s has no report yet (state %s): only a call reported failed with %s can be resolved", rec.ToolCallID, rec.State, protocol.CodeToolOutcomeUnknown), nil
	}
	var e protocol.ReportEntry
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return storedReport{}, "", fmt.Errorf("decode report entry %d: %w", m.Sequence, err)
	}
	r := storedReport{Sequence: m.Sequence, cardID: e.ToolResultCardID}
	code := ""
	if e.Status == protocol.StatusFailed {
		card, err := l.GetCard(ctx, rec.ProjectID, e.ToolResultCardID)
		if err != nil {
			return r, "", fmt.Errorf("result card %s: %w", e.ToolResultCardID, err)
		}
		code = taxonomyCode(&card.Card)
	}
	unknown, err := l.effectUnknown(ctx, rec, e.Status, code, "")
	if err != nil {
		return r, "", err
	}
	if !unknown {
		shown := code
		if shown == "" {
			shown = "none"
		}
		return r, fmt.Sprintf("call %s's report (seq %d) is %s with taxonomy code %s: only a call whose side effect is unknown can be resolved (reported failed with %s, or timeout by a side_effectful tool's call with an attempt on record)", rec.ToolCallID, m.Sequence, e.Status, shown, protocol.CodeToolOutcomeUnknown), nil
	}
	return r, "", nil
}

// effectUnknown reports whether a call's report (status, taxonomy code)
// leaves its side effect unknown: failed with S-TOOL-OUTCOME-UNKNOWN, or
// timeout for a side_effectful tool's call with an attempt on record (the
// tool gave up waiting, but the attempt may have reached the upstream).
// determinism, when "", is read (callDeterminism).
func (l *Ledger) effectUnknown(ctx context.Context, rec *protocol.CallRecord, status, code, determinism string) (bool, error) {
	switch status {
	case protocol.StatusFailed:
		return code == protocol.CodeToolOutcomeUnknown, nil
	case protocol.StatusTimeout:
	default:
		return false, nil
	}
	if determinism == "" {
		var err error
		if determinism, err = l.callDeterminism(ctx, rec); err != nil {
			return false, err
		}
	}
	if determinism != protocol.DeterminismSideEffectful {
		return false, nil
	}
	m, _, err := l.lastAttempt(ctx, protocol.AttemptSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID))
	if err != nil {
		return false, fmt.Errorf("read the attempt of call %s: %w", rec.ToolCallID, err)
	}
	return m != nil, nil
}

// taxonomyCode is a tool.result card's error.detail.taxonomy_code, "" when
// it has none.
func taxonomyCode(c *protocol.Card) string {
	tr, err := c.ToolResult()
	if err != nil || tr.Error == nil || len(tr.Error.Detail) == 0 {
		return ""
	}
	var d struct {
		TaxonomyCode string `json:"taxonomy_code"`
	}
	if json.Unmarshal(tr.Error.Detail, &d) != nil {
		return ""
	}
	return d.TaxonomyCode
}

// callResolution fills a call view's resolution: only a failed or
// timed-out call can have one, so no other call.get pays the read.
func (l *Ledger) callResolution(ctx context.Context, rec *protocol.CallRecord) (*protocol.ResolutionEntry, error) {
	if rec.Claim == nil || (rec.Claim.Status != protocol.StatusFailed && rec.Claim.Status != protocol.StatusTimeout) {
		return nil, nil
	}
	return l.resolutionOf(ctx, rec)
}

// Resolution reads a call's resolution (call.get's resolution), with its
// entry's seq: nil when the call has none.
func (l *Ledger) Resolution(ctx context.Context, project, turnID, callID string) (*protocol.ResolutionEntry, error) {
	rec, err := l.GetCall(ctx, project, turnID, callID)
	if err != nil {
		return nil, err
	}
	return l.callResolution(ctx, rec)
}
