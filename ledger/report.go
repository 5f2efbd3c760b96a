package ledger

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// reportInput is a report parsed and validated once, where it entered (the
// API's bytes, a typed Go request, or the ledger's own), as the one report
// core (report) takes it.
type reportInput struct {
	project, channel string
	id               protocol.Identity
	sourceID         string
	sourceFunction   string
	payload          protocol.ReportPayload
	stepID           string
	// deadline marks the ledger's own timeout report (deadline.go): it is
	// never late, and a refusal of it (a report won the race) is not
	// recorded, nor a duplicate of it (another process recorded it).
	deadline bool
	// approval marks the ledger's own report ending a held call its
	// decision denied, expired or canceled (approval.go): the one report a
	// held call accepts; its refusals and duplicates are not recorded, as
	// the timeout's are not.
	approval bool
	// op is the operation refusals are recorded under: report (empty) or
	// report.result.
	op string
	// result is the tool.result card of a report.result (result.go), stored
	// with the report entry; nil for a report.
	result *resultCard
	// swept marks a stored report the ledger's sweep replays to finish it
	// (sweep.go): like a Resume, but its answer goes to no one, so it is
	// not recorded as a duplicate, and a deadline passed since does not
	// make it late.
	swept bool
	// tookOver is set on a swept report whose wakeup its replay published.
	tookOver bool
}

// Report validates a tool result report, deduplicates it on (agent_turn_id,
// tool_call_id), fences it on turn_epoch, appends it, and wakes the agent.
// Every refusal is recorded as a rejection entry and returned as *Error.
//
// A request that is certainly valid goes to the core as it is; any other is
// read through the API's parser, over the headers and JSON it would have
// been sent as, so its violations and its rejection entry are exactly a
// remote report's.
func (l *Ledger) Report(ctx context.Context, req protocol.ReportRequest) (protocol.ReportOutcome, error) {
	return l.reportTyped(ctx, callerOf(ctx), req)
}

// reportTyped is Report for by: the caller it serves (its tool must be the
// call's), nil for the ledger's own reports and in-process ones, which that
// check does not apply to.
func (l *Ledger) reportTyped(ctx context.Context, by *protocol.Caller, req protocol.ReportRequest) (protocol.ReportOutcome, error) {
	if in, ok := reportFromRequest(req); ok {
		raw := func() protocol.RejectedRequest {
			h, data := reportWire(req)
			return protocol.NewRejectedRequest("", h, data)
		}
		return l.serveReport(ctx, by, in, raw)
	}
	h, data := reportWire(req)
	return l.reportMsg(ctx, by, h, data)
}

// reportWire is a typed report as the API receives it: CG-* headers and the
// JSON payload.
func reportWire(req protocol.ReportRequest) (nats.Header, []byte) {
	h := req.Identity.Header()
	h.Set(protocol.HeaderProjectID, req.ProjectID)
	h.Set(protocol.HeaderChannelID, req.ChannelID)
	h.Set(protocol.HeaderSourceID, req.SourceID)
	h.Set(protocol.HeaderSourceFunction, req.SourceFunction)
	// Strings only: the encoding cannot fail.
	data, _ := json.Marshal(req.Payload)
	return h, data
}

// reportFromRequest is a typed report as the core's input, when it is
// certainly valid: when protocol.ParseReport would find no violation in its
// reportWire form and read back the same values. Anything else (false) is
// left to that parser, which names every problem.
func reportFromRequest(req protocol.ReportRequest) (*reportInput, bool) {
	id, p := req.Identity, req.Payload
	ident := protocol.ValidIdentifier
	optIdent := func(s string) bool { return s == "" || ident(s) }
	ok := ident(req.ProjectID) && ident(req.ChannelID) &&
		protocol.ValidName(req.SourceID) && protocol.ValidName(req.SourceFunction) &&
		ident(id.AgentID) && ident(id.AgentTurnID) && ident(id.ToolCallID) &&
		optIdent(id.StepID) && optIdent(id.ContextBoxID) &&
		(id.Traceparent == "" || protocol.ValidTraceparent(id.Traceparent)) &&
		// A trace state rides along unread: only one that is certainly a
		// valid header value (printable ASCII) takes this way.
		len(id.Tracestate) <= 512 && printableASCII(id.Tracestate) &&
		protocol.ValidStatus(p.Status) && protocol.ValidAfterExecution(p.AfterExecution) &&
		ident(p.ToolResultCardID) && optIdent(p.StepID) &&
		// The payload's step_id repeats the header's, when both are given.
		(p.StepID == "" || id.StepID == "" || p.StepID == id.StepID) &&
		(p.AttemptOutcome == "" || protocol.ValidAttemptOutcome(p.AttemptOutcome)) &&
		(p.AttemptOutcome != protocol.AttemptOutcomeUnknown || p.Status == protocol.StatusFailed)
	if !ok {
		return nil, false
	}
	return &reportInput{project: req.ProjectID, channel: req.ChannelID, id: id, sourceID: req.SourceID,
		sourceFunction: req.SourceFunction, payload: p, stepID: cmp.Or(id.StepID, p.StepID)}, true
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// reportMsg parses a report as received over the API (CG-* headers and the
// JSON payload) once into the core's input; by is who sent it (nil in
// process). A report that does not parse is refused with the bytes as
// received.
func (l *Ledger) reportMsg(ctx context.Context, by *protocol.Caller, h nats.Header, data []byte) (protocol.ReportOutcome, error) {
	req, vs := protocol.ParseReport(h, data)
	in := &reportInput{project: req.ProjectID, channel: req.ChannelID, id: req.Identity, sourceID: req.SourceID,
		sourceFunction: req.SourceFunction, payload: req.Payload, stepID: cmp.Or(req.Identity.StepID, req.Payload.StepID)}
	raw := func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", h, data) }
	if len(vs) > 0 {
		return protocol.ReportOutcome{}, l.reject(ctx, by, protocol.OpReport, in.project, in.channel, protocol.NewError(protocol.CodeBadRequest, vs, "invalid report: %d violation(s)", len(vs)), raw())
	}
	return l.serveReport(ctx, by, in, raw)
}

// serveReport runs the core for a request's report, in the request's span
// (continuing the trace its identity names).
func (l *Ledger) serveReport(ctx context.Context, by *protocol.Caller, in *reportInput, raw func() protocol.RejectedRequest) (protocol.ReportOutcome, error) {
	ctx, span := startTraceSpan(ctx, in.id.Traceparent, in.id.Tracestate, "cgledger.report")
	out, err := l.report(ctx, by, in, raw)
	endSpan(span, err)
	return out, err
}

// prefetched is what the report path reads before deciding anything. The
// three reads are independent, so they run concurrently, and each is served
// from this process's memory when it wrote or read the value before: on the
// hot path (dispatch, executor and report in one process) none of them
// reaches the server.
type prefetched struct {
	rec     *protocol.CallRecord
	rev     uint64
	recErr  error
	card    *protocol.StoredCard
	cardErr error
	roster  *protocol.RosterResult
	rostErr error
}

func (l *Ledger) prefetch(ctx context.Context, key string, in *reportInput) *prefetched {
	p := &prefetched{}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if in.result != nil {
			// A report.result's card is the request's own, checked from
			// its bytes before anything is published.
			p.card = &protocol.StoredCard{Card: *in.result.card, Seq: in.result.seq}
			return
		}
		p.card, p.cardErr = l.cardCached(ctx, in.project, in.payload.ToolResultCardID)
	}()
	go func() {
		defer wg.Done()
		r, err := l.rosterCached(ctx, in.project, in.id.AgentID)
		if err == nil {
			p.roster = &r
		} else if !isCode(err, protocol.CodeNotFound) {
			p.rostErr = err
		}
	}()
	p.rec, p.rev, p.recErr = l.recordCached(ctx, key)
	wg.Wait()
	return p
}

func (l *Ledger) report(ctx context.Context, by *protocol.Caller, in *reportInput, raw func() protocol.RejectedRequest) (protocol.ReportOutcome, error) {
	// Close waits for reports in flight too: one it let go between the
	// append and the wakeup would leave the report for a sweep to finish.
	l.bg.start()
	defer l.bg.done()
	refuse := func(code protocol.Code, vs protocol.Violations, format string, args ...any) (protocol.ReportOutcome, error) {
		return protocol.ReportOutcome{}, l.refuseReport(ctx, by, in, protocol.NewError(code, vs, format, args...), raw)
	}
	key := callKey(in.project, in.id.AgentTurnID, in.id.ToolCallID)
	pre := l.prefetch(ctx, key, in)
	rec, rev := pre.rec, pre.rev
	if pre.recErr != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: %w", in.id.AgentTurnID, in.id.ToolCallID, pre.recErr)
	}
	if rec != nil {
		confirmed, _, err := l.dispatchConfirmed(ctx, rec)
		if err != nil {
			return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
		}
		if !confirmed {
			rec = nil
		}
	}
	if rec == nil {
		var vs protocol.Violations
		vs.Add("header."+protocol.HeaderToolCallID, protocol.VNotFound, "no call %s in turn %s of project %s was dispatched through the ledger", in.id.ToolCallID, in.id.AgentTurnID, in.project)
		return refuse(protocol.CodeUnknownCall, vs, "unknown call %s", in.id.ToolCallID)
	}
	if vs := callerOwnsCall(by, rec); len(vs) > 0 {
		return refuse(protocol.CodeForbidden, vs, "report for call %s from another tool", rec.ToolCallID)
	}
	if in.payload.AttemptOutcome != "" {
		// Only a report resolving an attempt pays this read: an attempt
		// outcome without an attempt on record would be a false story.
		m, err := l.lastForSubject(ctx, protocol.AttemptSubject(l.version, in.project, rec.ChannelID, in.id.AgentTurnID, in.id.ToolCallID))
		if err != nil {
			return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: read attempts: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
		}
		if m == nil {
			var vs protocol.Violations
			vs.Add("payload.attempt_outcome", protocol.VNotFound, "call %s has no attempt on record (attempt.start) to be %s", rec.ToolCallID, in.payload.AttemptOutcome)
			return refuse(protocol.CodeMismatch, vs, "report resolves no attempt of call %s", rec.ToolCallID)
		}
	}
	fp := reportFingerprint(in.payload.Status, in.payload.AfterExecution, in.payload.ToolResultCardID, in.stepID, in.sourceID, in.sourceFunction, in.payload.AttemptOutcome)
	conflict := func(c *protocol.Claim, state string) (protocol.ReportOutcome, error) {
		var vs protocol.Violations
		if c.SourceID == protocol.DeadlineSourceID && !in.deadline {
			l.m.lateReports.WithLabelValues(l.callToolLabel(rec)).Inc()
			vs.Add("payload", protocol.VLate, "call %s reached its deadline (%s) with no accepted report; the ledger recorded its outcome (status %s, seq %d): a later report is not accepted",
				rec.ToolCallID, protocol.FormatTime(rec.Deadline()), c.Status, c.Seq)
			return refuse(protocol.CodeConflict, vs, "call %s is late: its deadline passed and the ledger recorded its outcome (%s)", rec.ToolCallID, c.Status)
		}
		vs.Add("payload", protocol.VConflict, "call %s was already reported by %s: status %s, tool_result_card_id %s, after_execution %s (state %s, seq %d)",
			rec.ToolCallID, c.SourceID, c.Status, c.ToolResultCardID, c.AfterExecution, state, c.Seq)
		return refuse(protocol.CodeConflict, vs, "call %s already has a different result", rec.ToolCallID)
	}
	deadlineChecked := in.deadline || in.swept
	for range 64 {
		if in.id.TurnEpoch != rec.TurnEpoch {
			var vs protocol.Violations
			vs.Add("header."+protocol.HeaderTurnEpoch, "stale_epoch", "call %s was dispatched with turn_epoch %d; report has %d", rec.ToolCallID, rec.TurnEpoch, in.id.TurnEpoch)
			return refuse(protocol.CodeStaleEpoch, vs, "stale turn_epoch %d for call %s (dispatched with %d)", in.id.TurnEpoch, rec.ToolCallID, rec.TurnEpoch)
		}
		if vs := matchCall(rec, in, fp); len(vs) > 0 {
			return refuse(protocol.CodeMismatch, vs, "report does not match call %s", rec.ToolCallID)
		}
		var claim *protocol.Claim
		switch {
		case rec.State == protocol.StateAwaitingApproval && !in.approval:
			// No command was published for a held call, so no tool can
			// have run it. An approval whose follow-up is not finished
			// (the command is out, the record not moved yet) is finished
			// here; otherwise the report is refused.
			decided, seq, err := l.decisionOf(ctx, rec)
			if err != nil {
				return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
			}
			if decided != nil {
				if _, err := l.finishDecision(ctx, rec, decided, seq); err != nil {
					return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
				}
				if rec, rev, err = l.reread(ctx, key); err != nil {
					return protocol.ReportOutcome{}, err
				}
				if rec.State != protocol.StateAwaitingApproval {
					continue
				}
			}
			var vs protocol.Violations
			vs.Add("header."+protocol.HeaderToolCallID, protocol.VConflict, "call %s is held for approval: the ledger published no command for it, so there is nothing to report", rec.ToolCallID)
			return refuse(protocol.CodeConflict, vs, "call %s is held for approval", rec.ToolCallID)
		case rec.State == protocol.StateAwaitingApproval:
			c, rerr := l.buildClaim(rec, in, fp, pre.card, pre.cardErr)
			if rerr != nil {
				if e, ok := protocol.AsError(rerr); ok {
					return protocol.ReportOutcome{}, l.refuseReport(ctx, by, in, e, raw)
				}
				return protocol.ReportOutcome{}, rerr
			}
			claim = c
		case rec.State == protocol.StatePaused && !in.deadline:
			// Held by a pause: no command was published, so no tool ran
			// it; only its deadline (the keeper) ends it while paused.
			var vs protocol.Violations
			vs.Add("header."+protocol.HeaderToolCallID, protocol.VConflict, "call %s is held: its tool %s is paused and the ledger published no command for it, so there is nothing to report", rec.ToolCallID, rec.ToolName)
			return refuse(protocol.CodeConflict, vs, "call %s is held by a pause of its tool", rec.ToolCallID)
		case rec.State == protocol.StatePaused:
			c, rerr := l.buildClaim(rec, in, fp, pre.card, pre.cardErr)
			if rerr != nil {
				if e, ok := protocol.AsError(rerr); ok {
					return protocol.ReportOutcome{}, l.refuseReport(ctx, by, in, e, raw)
				}
				return protocol.ReportOutcome{}, rerr
			}
			claim = c
		case rec.State == protocol.StateDispatched && !deadlineChecked && l.pastDeadline(rec, time.Now()):
			// A report after the deadline (and its grace) that finds the
			// timeout not yet recorded records it, through the same claim,
			// and is answered late: never accepted over the deadline.
			deadlineChecked = true
			out, terr := l.recordTimeout(ctx, rec)
			if terr == nil {
				return conflict(&protocol.Claim{SourceID: protocol.DeadlineSourceID, Status: out.Status, Seq: out.Seq}, protocol.StateWoken)
			}
			if e, ok := protocol.AsError(terr); !ok || e.Code != protocol.CodeConflict {
				return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: record the timeout: %w", in.id.AgentTurnID, in.id.ToolCallID, terr)
			}
			// A report was stored first: go on as for any other report.
			var err error
			if rec, rev, err = l.reread(ctx, key); err != nil {
				return protocol.ReportOutcome{}, err
			}
			continue
		case rec.State == protocol.StateDispatched:
			c, rerr := l.buildClaim(rec, in, fp, pre.card, pre.cardErr)
			if rerr != nil {
				if e, ok := protocol.AsError(rerr); ok {
					return protocol.ReportOutcome{}, l.refuseReport(ctx, by, in, e, raw)
				}
				return protocol.ReportOutcome{}, rerr
			}
			claim = c
		case rec.Claim == nil:
			return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: record in state %s has no claim", in.id.AgentTurnID, in.id.ToolCallID, rec.State)
		case rec.Claim.Fingerprint != fp:
			return conflict(rec.Claim, rec.State)
		case rec.State == protocol.StateWoken:
			return l.finishReport(ctx, by, rec, in, true)
		case takeoverMark(rec):
			// A takeover has locked the record (woken.go): the entry is
			// stored; its wakeup is the taker's to publish.
			claim = nil
		default:
			// A claim written by an earlier version of the ledger, before
			// the report entry itself became the claim: append its bytes.
			// Its error code was not kept (never is): the card the
			// fingerprint names, the report's own, holds it.
			claim = withClaim(rec).Claim
			code, err := resultErrorCode(pre.card, pre.cardErr)
			if err != nil {
				return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
			}
			claim.ErrorCode = code
		}

		// The append is the claim: the subject is the call's own and must be
		// empty, so of any number of concurrent reports exactly one stores
		// its entry, through any number of ledger processes.
		var seq uint64
		var stored *protocol.Claim
		var err error
		if claim == nil {
			seq, stored, err = l.readReport(ctx, rec.Claim.Subject)
		} else {
			seq, stored, err = l.appendResult(ctx, by, in, l.callToolLabel(rec), claim, raw)
		}
		if err != nil {
			return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: append: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
		}
		here := stored == nil
		if !here {
			if stored.Fingerprint != fp {
				return conflict(stored, "reported")
			}
			claim = stored
		}
		claim.Seq = seq
		if err := l.step(stepAppended); err != nil {
			return protocol.ReportOutcome{}, err
		}
		if !here {
			// Another report stored the entry: it publishes the one wakeup.
			// Wait for the stream to hold it; take over only once the entry
			// (and any takeover's mark) is older than the lease (its writer
			// crashed or stalled), behind the record's compare-and-set.
			woken, wrec, err := l.awaitWoken(ctx, rec, claim)
			if err != nil {
				return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
			}
			if woken {
				l.cacheRecord(key, wrec, rev)
				rec = wrec
				continue
			}
			nrev, won, err := l.lockTakeover(ctx, key, rec, rev, claim)
			if err != nil {
				return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: take over: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
			}
			if !won {
				if rec, rev, err = l.reread(ctx, key); err != nil {
					return protocol.ReportOutcome{}, err
				}
				continue
			}
			rev = nrev
		}
		next := cloneRecord(rec)
		if takeoverMark(next) {
			// The record keeps what dispatch fixed; the state is the
			// stream's to tell.
			next.State = protocol.StateDispatched
		}
		next.Claim = claim
		if pre.rostErr != nil {
			return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: roster: %w", in.id.AgentTurnID, in.id.ToolCallID, pre.rostErr)
		}
		appended := time.Now()
		woke, err := l.wake(ctx, by, next, pre.roster)
		if err != nil {
			return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: wakeup: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
		}
		if err := l.step(stepWoken); err != nil {
			return protocol.ReportOutcome{}, err
		}
		// The wakeup is the mark (woken.go): no record is written. This
		// process keeps the woken record, at the revision it read (the
		// bucket's), so its duplicates, the agent's consume and call.get
		// need no read; any other reader finds the wakeup in the stream.
		// The record keeps the outcome, not the entry's bytes: the stream
		// holds those.
		next.State = protocol.StateWoken
		next.Claim.Header, next.Claim.Data, next.Claim.LeaseUntil = nil, nil, time.Time{}
		l.cacheRecord(key, next, rev)
		if here {
			tool := l.callToolLabel(rec)
			l.m.wakeupLatency.WithLabelValues(tool).Observe(time.Since(appended).Seconds())
			if !rec.DispatchedAt.IsZero() {
				l.m.callLatency.WithLabelValues(tool, l.labels.VersionLabel(rec.ToolName, rec.ToolVersion)).Observe(appended.Sub(rec.DispatchedAt).Seconds())
			}
			return l.finishReport(ctx, by, next, in, false)
		}
		if in.swept && woke {
			// A takeover that outlived its lease lets another one take
			// over and publish the same wakeup: the one that stored it
			// finished the report.
			in.tookOver = true
			l.m.sweptReports.Inc()
		}
		return l.finishReport(ctx, by, next, in, true)
	}
	return protocol.ReportOutcome{}, fmt.Errorf("report %s/%s: too many concurrent updates to the call record", in.id.AgentTurnID, in.id.ToolCallID)
}

// readReport reads the stored report entry of a call a takeover has
// locked, as appendReport answers for an entry already there.
func (l *Ledger) readReport(ctx context.Context, subject string) (uint64, *protocol.Claim, error) {
	m, err := l.storedEntry(ctx, subject)
	if err != nil {
		return 0, nil, err
	}
	c, err := l.claimFromEntry(m)
	if err != nil {
		return 0, nil, err
	}
	return m.Sequence, c, nil
}

// withClaim copies a record deeply enough to change its claim.
func withClaim(rec *protocol.CallRecord) *protocol.CallRecord {
	next := *rec
	c := *rec.Claim
	next.Claim = &c
	return &next
}

// reread reads a call record again after an update lost the race for it,
// so its absence is an error, not an answer.
func (l *Ledger) reread(ctx context.Context, key string) (*protocol.CallRecord, uint64, error) {
	rec, rev, err := l.getRecord(ctx, key)
	if err != nil {
		return nil, 0, fmt.Errorf("re-read call record %s: %w", key, err)
	}
	if rec == nil {
		return nil, 0, fmt.Errorf("re-read call record %s: it vanished", key)
	}
	return rec, rev, nil
}

// matchCall checks the report's routing identity, and its after_execution,
// against the dispatched call. fp is the report's fingerprint.
func matchCall(rec *protocol.CallRecord, in *reportInput, fp string) protocol.Violations {
	var vs protocol.Violations
	if in.channel != rec.ChannelID {
		vs.Add("header."+protocol.HeaderChannelID, protocol.VMismatch, "call %s was dispatched on channel %q, report names %q", rec.ToolCallID, rec.ChannelID, in.channel)
	}
	if in.id.AgentID != rec.AgentID {
		vs.Add("header."+protocol.HeaderAgentID, protocol.VMismatch, "call %s belongs to agent %q, report names %q", rec.ToolCallID, rec.AgentID, in.id.AgentID)
	}
	if in.stepID != "" && rec.StepID != "" && in.stepID != rec.StepID {
		vs.Add("header."+protocol.HeaderStepID, protocol.VMismatch, "call %s was dispatched with step_id %q, report names %q", rec.ToolCallID, rec.StepID, in.stepID)
	}
	// after_execution is the dispatcher's decision, carried through
	// unchanged; only the result card's __cg_control may override it, as the
	// effective value. A report repeating the claim already accepted is
	// exempt, so that a call accepted before this check existed still
	// answers its retries (and Resume) as a duplicate.
	repeat := rec.Claim != nil && rec.Claim.Fingerprint == fp
	if rec.AfterExecution != "" && in.payload.AfterExecution != rec.AfterExecution && !repeat {
		vs.Add("payload.after_execution", protocol.VMismatch, "call %s was dispatched with after_execution %q, report has %q; it must be carried through unchanged (the result card's result.__cg_control.after_execution may override the effective value)",
			rec.ToolCallID, rec.AfterExecution, in.payload.AfterExecution)
	}
	return vs
}

// buildClaim validates the result card pointer and prepares the report entry.
func (l *Ledger) buildClaim(rec *protocol.CallRecord, in *reportInput, fp string, sc *protocol.StoredCard, err error) (*protocol.Claim, error) {
	if err != nil {
		if isCode(err, protocol.CodeUnknownCard) {
			var vs protocol.Violations
			vs.Add("payload.tool_result_card_id", protocol.VNotFound, "card %s does not exist in project %s", in.payload.ToolResultCardID, in.project)
			return nil, protocol.NewError(protocol.CodeUnknownCard, vs, "result card %s not found", in.payload.ToolResultCardID)
		}
		return nil, err
	}
	c := &sc.Card
	var vs protocol.Violations
	if c.Type != protocol.CardToolResult {
		vs.Add("card.type", protocol.VMismatch, "card %s is a %s card, not %s", c.CardID, c.Type, protocol.CardToolResult)
	}
	if c.AgentTurnID != rec.AgentTurnID || c.ToolCallID != rec.ToolCallID {
		vs.Add("card.tool_call_id", protocol.VMismatch, "card %s belongs to call %s/%s, not %s/%s", c.CardID, c.AgentTurnID, c.ToolCallID, rec.AgentTurnID, rec.ToolCallID)
	}
	if c.AuthorID != in.sourceID {
		vs.Add("card.author_id", protocol.VMismatch, "card author %q is not the reporting source %q", c.AuthorID, in.sourceID)
	}
	if c.FunctionName != in.sourceFunction {
		vs.Add("card.function_name", protocol.VMismatch, "card function_name %q is not the reporting source's %q", c.FunctionName, in.sourceFunction)
	}
	want := rec.CardMetadata
	if c.Metadata.TraceID != want.TraceID {
		vs.Add("card.metadata.trace_id", protocol.VMismatch, "must be copied verbatim from the tool.call card (%q), got %q", want.TraceID, c.Metadata.TraceID)
	}
	if c.Metadata.ParentStepID != want.ParentStepID {
		vs.Add("card.metadata.parent_step_id", protocol.VMismatch, "must be copied verbatim from the tool.call card (%q), got %q", want.ParentStepID, c.Metadata.ParentStepID)
	}
	if c.Metadata.StepID != want.StepID {
		vs.Add("card.metadata.step_id", protocol.VMismatch, "must be copied verbatim from the tool.call card (%q), got %q", want.StepID, c.Metadata.StepID)
	}
	effective, errorCode := in.payload.AfterExecution, ""
	if c.Type == protocol.CardToolResult {
		tr, err := c.ToolResult()
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		if tr.Status != in.payload.Status {
			vs.Add("payload.status", protocol.VMismatch, "report status %q differs from the result card's status %q", in.payload.Status, tr.Status)
		}
		effective = tr.EffectiveAfterExecution(in.payload.AfterExecution)
		errorCode = tr.ErrorCode()
	}
	if len(vs) > 0 {
		return nil, protocol.NewError(protocol.CodeMismatch, vs, "result card %s does not match call %s", c.CardID, rec.ToolCallID)
	}
	entry := protocol.ReportEntry{
		CallID: callIDOf(in.project, in.channel, in.id), StepID: in.stepID,
		Status: in.payload.Status, AfterExecution: in.payload.AfterExecution, EffectiveAfterExecution: effective,
		ToolResultCardID: c.CardID, ToolResultCardSeq: sc.Seq, ToolCallCardID: rec.ToolCallCardID, ToolName: rec.ToolName,
		SourceID: in.sourceID, SourceFunction: in.sourceFunction, CommandSeq: rec.CommandSeq, AttemptOutcome: in.payload.AttemptOutcome,
	}
	data, err := json.Marshal(entry)
	if err != nil {
		return nil, fmt.Errorf("report: encode entry: %w", err)
	}
	if in.result != nil {
		in.result.entry = &entry
	}
	h := in.id.Header()
	h.Set(protocol.HeaderProjectID, in.project)
	h.Set(protocol.HeaderChannelID, in.channel)
	h.Set(protocol.HeaderSourceID, in.sourceID)
	h.Set(protocol.HeaderSourceFunction, in.sourceFunction)
	// The claim fixes the entry's time too, so a retry appends identical bytes.
	h.Set(protocol.HeaderTime, protocol.FormatTime(time.Now()))
	return &protocol.Claim{
		LeaseUntil:  time.Now().Add(l.lease),
		Fingerprint: fp, Status: in.payload.Status, AfterExecution: in.payload.AfterExecution,
		EffectiveAfterExecution: effective, ToolResultCardID: c.CardID, SourceID: in.sourceID,
		Subject: protocol.ReportSubject(l.version, in.project, in.channel, in.id.AgentTurnID, in.id.ToolCallID),
		MsgID:   "report." + in.project + "." + in.id.AgentTurnID + "." + in.id.ToolCallID,
		Header:  h, Data: data, AttemptOutcome: in.payload.AttemptOutcome, ErrorCode: errorCode,
	}, nil
}

// resultErrorCode is the error code of a stored result card ("" for none).
func resultErrorCode(sc *protocol.StoredCard, err error) (string, error) {
	if err != nil {
		return "", fmt.Errorf("read the result card: %w", err)
	}
	tr, err := sc.Card.ToolResult()
	if err != nil {
		return "", err
	}
	return tr.ErrorCode(), nil
}

// appendReport appends a report entry at most once: the entry's subject is
// unique to the call, and the append expects that subject to be empty, which
// holds across restarts (unlike the Nats-Msg-Id window). stored is nil when
// this call wrote the entry; otherwise it is the entry already there, as a
// claim, and seq is its sequence. The outcome is counted here, by the one
// process that stored the entry, so every source of reports (tool services,
// executors, the deadline keeper, fail-fast) is counted exactly once, under
// toolLabel (the call's, callToolLabel).
func (l *Ledger) appendReport(ctx context.Context, by *protocol.Caller, toolLabel string, c *protocol.Claim) (seq uint64, stored *protocol.Claim, err error) {
	msg := &nats.Msg{Subject: c.Subject, Data: c.Data, Header: nats.Header{}}
	for k, v := range c.Header {
		msg.Header[k] = append([]string(nil), v...)
	}
	msg.Header.Set(protocol.HeaderMsgID, c.MsgID)
	ack, err := l.appendEntry(ctx, by, protocol.KindReport, msg, jetstream.WithExpectLastSequencePerSubject(0))
	if err == nil && !ack.Duplicate {
		l.m.reports.WithLabelValues(c.Status).Inc()
		l.m.toolCalls.WithLabelValues(toolLabel, c.Status, ErrorCodeLabel(c.ErrorCode)).Inc()
		if c.AttemptOutcome != "" {
			l.m.attemptOutcome.WithLabelValues(c.AttemptOutcome).Inc()
		}
		return ack.Sequence, nil, nil
	}
	if err != nil && !isWrongLastSeq(err) {
		return 0, nil, err
	}
	existing, gerr := l.storedEntry(ctx, c.Subject)
	if gerr != nil {
		return 0, nil, fmt.Errorf("report entry exists but cannot be read: %w", gerr)
	}
	stored, err = l.claimFromEntry(existing)
	if err != nil {
		return 0, nil, err
	}
	return existing.Sequence, stored, nil
}

// reportFingerprint identifies a report's outcome. attempt_outcome counts
// only when set, so the reports of earlier versions keep their fingerprints.
func reportFingerprint(status, after, cardID, stepID, sourceID, sourceFunction, attemptOutcome string) string {
	if attemptOutcome == "" {
		return fingerprint(status, after, cardID, stepID, sourceID, sourceFunction)
	}
	return fingerprint(status, after, cardID, stepID, sourceID, sourceFunction, attemptOutcome)
}

// claimFromEntry reads a stored report entry back as the claim it won: its
// fingerprint, outcome and the lease its writer holds from the entry's time.
func (l *Ledger) claimFromEntry(m *jetstream.RawStreamMsg) (*protocol.Claim, error) {
	var e protocol.ReportEntry
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return nil, fmt.Errorf("decode report entry %d: %w", m.Sequence, err)
	}
	at, ok := protocol.EntryTime(m.Header)
	if !ok {
		at = m.Time
	}
	return &protocol.Claim{
		Fingerprint: reportFingerprint(e.Status, e.AfterExecution, e.ToolResultCardID, e.StepID, e.SourceID, e.SourceFunction, e.AttemptOutcome),
		Status:      e.Status, AfterExecution: e.AfterExecution, EffectiveAfterExecution: e.EffectiveAfterExecution,
		ToolResultCardID: e.ToolResultCardID, SourceID: e.SourceID, Subject: m.Subject,
		MsgID: protocol.HeaderGet(m.Header, protocol.HeaderMsgID), Seq: m.Sequence, LeaseUntil: at.Add(l.lease),
		AttemptOutcome: e.AttemptOutcome,
	}, nil
}

// wake publishes the wakeup to the agent's worker target (read when the
// report arrived), or records that the agent has none. It fills the claim's
// wakeup fields, and says whether this call stored the entry: not when the
// stream already held it (a takeover whose writer outlived its lease
// published it too).
func (l *Ledger) wake(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord, roster *protocol.RosterResult) (bool, error) {
	c := rec.Claim
	if roster == nil {
		data, merr := json.Marshal(protocol.WakeupSkippedEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID,
			AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID, ReportSeq: c.Seq, Reason: protocol.NoRosterEntry})
		if merr != nil {
			return false, merr
		}
		subj := protocol.WakeupSkippedSubject(l.version, rec.ProjectID, rec.ChannelID, rec.AgentTurnID, rec.ToolCallID)
		msg := &nats.Msg{Subject: subj, Data: data, Header: nats.Header{}}
		msg.Header.Set(protocol.HeaderProjectID, rec.ProjectID)
		msg.Header.Set(protocol.HeaderChannelID, rec.ChannelID)
		msg.Header.Set(protocol.HeaderAgentID, rec.AgentID)
		msg.Header.Set(protocol.HeaderAgentTurnID, rec.AgentTurnID)
		msg.Header.Set(protocol.HeaderToolCallID, rec.ToolCallID)
		ack, err := l.appendEntry(ctx, by, protocol.KindWakeupSkipped, msg, jetstream.WithExpectLastSequencePerSubject(0))
		stored := false
		switch {
		case err == nil:
			if !ack.Duplicate {
				stored = true
				l.m.wakeupsSkipped.Inc()
			}
		case isWrongLastSeq(err):
		default:
			return false, err
		}
		c.WakeupSkipped, c.WakeupSubject, c.WorkerTarget, c.WakeupSeq = true, "", "", 0
		return stored, nil
	}
	data, err := json.Marshal(protocol.WakeupEntry{ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, AgentID: rec.AgentID,
		WorkerTarget: roster.WorkerTarget, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID,
		Status: c.Status, ToolResultCardID: c.ToolResultCardID, EffectiveAfterExecution: c.EffectiveAfterExecution, ReportSeq: c.Seq})
	if err != nil {
		return false, err
	}
	subj := protocol.WakeupSubject(l.version, rec.ProjectID, rec.ChannelID, roster.WorkerTarget)
	msg := &nats.Msg{Subject: subj, Data: data, Header: protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID, StepID: rec.StepID}.Header()}
	msg.Header.Set(protocol.HeaderMsgID, "wakeup."+rec.ProjectID+"."+rec.AgentTurnID+"."+rec.ToolCallID)
	ack, err := l.appendEntry(ctx, by, protocol.KindWakeup, msg)
	if err != nil {
		return false, err
	}
	if !ack.Duplicate {
		l.m.wakeups.Inc()
	}
	c.WakeupSubject, c.WorkerTarget, c.WakeupSeq, c.WakeupSkipped = subj, roster.WorkerTarget, ack.Sequence, false
	return !ack.Duplicate, nil
}

// finishReport builds the outcome and, for a duplicate, records it.
func (l *Ledger) finishReport(ctx context.Context, by *protocol.Caller, rec *protocol.CallRecord, in *reportInput, duplicate bool) (protocol.ReportOutcome, error) {
	c := rec.Claim
	out := protocol.ReportOutcome{
		Seq: c.Seq, AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID, ToolResultCardID: c.ToolResultCardID,
		Status: c.Status, AfterExecution: c.AfterExecution, EffectiveAfterExecution: c.EffectiveAfterExecution,
		Duplicate: duplicate,
		Wakeup:    protocol.WakeupOutcome{Subject: c.WakeupSubject, WorkerTarget: c.WorkerTarget, Seq: c.WakeupSeq, Skipped: c.WakeupSkipped},
	}
	if c.WakeupSkipped {
		out.Wakeup.Reason = protocol.NoRosterEntry
	}
	if !duplicate || in.deadline || in.approval || in.swept {
		return out, nil
	}
	l.m.duplicates.Inc()
	data, err := json.Marshal(protocol.DuplicateEntry{CallID: callIDOf(in.project, in.channel, in.id), Status: in.payload.Status,
		ToolResultCardID: in.payload.ToolResultCardID, SourceID: in.sourceID, OriginalSeq: c.Seq})
	if err != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("report: encode duplicate entry: %w", err)
	}
	msg := &nats.Msg{Subject: protocol.DuplicateSubject(l.version, in.project, in.channel, in.id.AgentTurnID, in.id.ToolCallID), Data: data, Header: in.id.Header()}
	msg.Header.Set(protocol.HeaderProjectID, in.project)
	msg.Header.Set(protocol.HeaderChannelID, in.channel)
	msg.Header.Set(protocol.HeaderSourceID, in.sourceID)
	ack, err := l.appendEntry(ctx, by, protocol.KindDuplicate, msg)
	if err != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("report: record duplicate of seq %s: %w", strconv.FormatUint(c.Seq, 10), err)
	}
	out.DuplicateSeq = ack.Sequence
	return out, nil
}

// Resume finishes a report whose entry is stored but whose wakeup or final
// mark may be missing (its reporter crashed or gave up): it replays the
// stored report exactly, so the ledger ends with the one report the entry
// holds. Executors call it when a redelivered command finds its call not yet
// woken, instead of running the tool again. A call with no stored report
// (nor a claim written by an earlier version) is an error matching
// ErrNotReported.
func (l *Ledger) Resume(ctx context.Context, project, turnID, callID string) (protocol.ReportOutcome, error) {
	return l.resume(ctx, callerOf(ctx), project, turnID, callID)
}

// resume is Resume for by, the caller whose report.resume replays it.
func (l *Ledger) resume(ctx context.Context, by *protocol.Caller, project, turnID, callID string) (protocol.ReportOutcome, error) {
	rec, err := l.GetCall(ctx, project, turnID, callID)
	if err != nil {
		return protocol.ReportOutcome{}, err
	}
	m, err := l.lastForSubject(ctx, protocol.ReportSubject(l.version, project, rec.ChannelID, turnID, callID))
	if err != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("resume %s/%s: %w", turnID, callID, err)
	}
	var data []byte
	switch {
	case m != nil:
		data = m.Data
	case rec.Claim != nil && len(rec.Claim.Data) > 0:
		data = rec.Claim.Data
	default:
		return protocol.ReportOutcome{}, protocol.NewError(protocol.CodeNotReported, nil, "call %s has no stored report to resume", callID)
	}
	var e protocol.ReportEntry
	if err := json.Unmarshal(data, &e); err != nil {
		return protocol.ReportOutcome{}, fmt.Errorf("resume %s/%s: decode report entry: %w", turnID, callID, err)
	}
	return l.reportTyped(ctx, by, protocol.ReportRequest{
		ProjectID: e.ProjectID, ChannelID: e.ChannelID, SourceID: e.SourceID, SourceFunction: e.SourceFunction,
		Identity: protocol.Identity{AgentID: e.AgentID, AgentTurnID: e.AgentTurnID, TurnEpoch: e.TurnEpoch, ToolCallID: e.ToolCallID, StepID: e.StepID},
		Payload:  protocol.ReportPayload{Status: e.Status, AfterExecution: e.AfterExecution, ToolResultCardID: e.ToolResultCardID, StepID: e.StepID, AttemptOutcome: e.AttemptOutcome},
	})
}

// refuseReport records a refused report and returns the refusal; the
// ledger's own timeout report is refused without a record (deadline.go).
func (l *Ledger) refuseReport(ctx context.Context, by *protocol.Caller, in *reportInput, e *protocol.Error, raw func() protocol.RejectedRequest) error {
	if in.deadline || in.approval || in.swept {
		return e
	}
	if in.result != nil {
		e = resultPaths(e)
	}
	return l.reject(ctx, by, cmp.Or(in.op, protocol.OpReport), in.project, in.channel, e, raw())
}
