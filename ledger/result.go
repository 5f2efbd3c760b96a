package ledger

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/cgledger/cgledger/internal/backoff"
	"github.com/cgledger/cgledger/protocol"
)

// resultCard is the tool.result card a report.result carries (reportInput's
// result): checked with the report from the request's bytes, and stored
// with the report entry in one atomic batch, or found already stored.
type resultCard struct {
	card   *protocol.Card
	stored []byte
	// seq is the card's sequence once known: stored by the batch, or found.
	seq uint64
	// held says the card is stored already, identical: the report entry is
	// appended alone (appendReport), with the card's sequence.
	held bool
	// entry is the report entry its claim encodes (buildClaim), kept so
	// that adding the card's sequence once known is one encoding, not a
	// decode of the claim's bytes and a second encoding.
	entry *protocol.ReportEntry
}

// ReportResult stores a call's tool.result card and its report together
// (the report.result operation): one request, one atomic batch of two
// entries, every check card.put and Report make done before either is
// published. card is the card as PutCard takes it; req is the report as
// Report takes it, whose Payload.ToolResultCardID may be empty (it is the
// card's id) and, when given, must be the card's id. A card already stored
// identically under its id (a retry, or PutCard before) leaves the report
// to be appended alone, and the answer says CardDuplicate; a different card
// under that id is refused as PutCard refuses it. Every refusal is recorded
// as a rejection entry and returned as *Error.
//
// A card and report that are certainly valid go to the core as they are
// (resultFromRequest); any other pair is read through the API's parser,
// over the headers and body it would have been sent as, so its violations
// and its rejection entry are exactly a remote report.result's.
func (l *Ledger) ReportResult(ctx context.Context, card protocol.Card, req protocol.ReportRequest) (protocol.ReportResultOutcome, error) {
	by := callerOf(ctx)
	if in, ok := resultFromRequest(card, req, int(l.streams.MaxMsgSize)-4096); ok {
		raw := func() protocol.RejectedRequest {
			h, data := reportResultWire(card, req)
			return protocol.NewRejectedRequest("", h, data)
		}
		return l.serveResult(ctx, by, in, raw)
	}
	h, data := reportResultWire(card, req)
	return l.reportResultMsg(ctx, by, nil, h, data)
}

// resultFromRequest is a typed report.result as the core's input, when it
// is certainly valid: when protocol.ParseReportResult would find no
// violation in its reportResultWire form and read back the same report,
// the same card and the same stored bytes, and the card fits maxStored
// (the stream's room for it). Anything else (false) is left to that
// parser, which names every problem.
func resultFromRequest(card protocol.Card, req protocol.ReportRequest, maxStored int) (*reportInput, bool) {
	stored, status, ok := protocol.ResultCardCertain(&card)
	if !ok || len(stored) > maxStored || status != req.Payload.Status {
		return nil, false
	}
	// The parser's checks of the card against the report: the same call,
	// project and author; the report's card id, when given, the card's.
	id := req.Identity
	if card.ProjectID != req.ProjectID || card.AgentTurnID != id.AgentTurnID || card.ToolCallID != id.ToolCallID ||
		card.AuthorID != req.SourceID || card.FunctionName != req.SourceFunction ||
		(req.Payload.ToolResultCardID != "" && req.Payload.ToolResultCardID != card.CardID) {
		return nil, false
	}
	req.Payload.ToolResultCardID = card.CardID
	in, ok := reportFromRequest(req)
	if !ok {
		return nil, false
	}
	in.op = protocol.OpReportResult
	in.result = &resultCard{card: &card, stored: stored}
	return in, true
}

// reportResultWire is a typed report.result as the API receives it: the
// report's CG-* headers and the body {"card": ..., "report": ...}. The
// typed call is read by the API's parser, so its violations, its checks and
// its rejection entry are exactly a remote one's.
func reportResultWire(card protocol.Card, req protocol.ReportRequest) (nats.Header, []byte) {
	h, _ := reportWire(req)
	// A card's content is JSON already; encoding the rest cannot fail, and
	// content that is not JSON is refused by the parser as card.put's is.
	data, err := json.Marshal(protocol.ReportResultBody{Card: card, Report: req.Payload})
	if err != nil {
		data, _ = json.Marshal(map[string]any{"card": map[string]any{"card_id": card.CardID, "project_id": card.ProjectID}, "report": req.Payload})
	}
	return h, data
}

// reportResultMsg serves a report.result as received (h, data); by is who
// sent it (nil in process). api, when set, is the request on an API
// subject whose caller check this runs first (callerChecked): on what the
// parse read when it read everything, else on the bytes.
func (l *Ledger) reportResultMsg(ctx context.Context, by *protocol.Caller, api *apiRequest, h nats.Header, data []byte) (protocol.ReportResultOutcome, error) {
	r, vs := protocol.ParseReportResult(h, data)
	if err := l.callerChecked(ctx, api, func() protocol.Violations {
		if len(vs) > 0 {
			return api.bytesCaller()
		}
		return protocol.CheckReportResultCaller(api.c, r.Report.ProjectID, r.Card.ProjectID)
	}); err != nil {
		return protocol.ReportResultOutcome{}, err
	}
	req := r.Report
	in := &reportInput{project: req.ProjectID, channel: req.ChannelID, id: req.Identity, sourceID: req.SourceID,
		sourceFunction: req.SourceFunction, payload: req.Payload, stepID: cmp.Or(req.Identity.StepID, req.Payload.StepID),
		op: protocol.OpReportResult}
	raw := func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", h, data) }
	if r.Card != nil && len(r.Stored) > int(l.streams.MaxMsgSize)-4096 {
		vs.Add("body.card", protocol.VTooLarge, "card is %d bytes; the limit is %d", len(r.Stored), int(l.streams.MaxMsgSize)-4096)
	}
	if len(vs) > 0 {
		return protocol.ReportResultOutcome{}, l.reject(ctx, by, protocol.OpReportResult, in.project, in.channel,
			protocol.NewError(protocol.CodeBadRequest, vs, "invalid report.result: %d violation(s)", len(vs)), raw())
	}
	in.result = &resultCard{card: r.Card, stored: r.Stored}
	return l.serveResult(ctx, by, in, raw)
}

// serveResult runs the core for a request's report.result (in.result its
// card), in the request's span.
func (l *Ledger) serveResult(ctx context.Context, by *protocol.Caller, in *reportInput, raw func() protocol.RejectedRequest) (protocol.ReportResultOutcome, error) {
	if err := l.resultCardStored(ctx, by, in, raw); err != nil {
		return protocol.ReportResultOutcome{}, err
	}
	// The report's span, as for a report: its result card is part of it.
	ctx, span := startTraceSpan(ctx, in.id.Traceparent, in.id.Tracestate, "cgledger.report")
	out, err := l.report(ctx, by, in, raw)
	endSpan(span, err)
	if err != nil {
		var refused *resultRefusal
		if errors.As(err, &refused) {
			return protocol.ReportResultOutcome{}, refused.err
		}
		return protocol.ReportResultOutcome{}, err
	}
	return protocol.ReportResultOutcome{ReportOutcome: out, CardSeq: in.result.seq, CardDuplicate: in.result.held}, nil
}

// resultCardStored finds out, when it may be so, whether the card's id
// already holds a card: when this process remembers the card, or when the
// call is not plainly dispatched (a report may be stored, and a duplicate
// answer must not hide a different card under the id). An identical card
// is held (the report is appended alone); a different one is refused as
// card.put refuses it. On the hot path (the call dispatched, the card new)
// it reads nothing: the batch's own check on the card's subject decides.
func (l *Ledger) resultCardStored(ctx context.Context, by *protocol.Caller, in *reportInput, raw func() protocol.RejectedRequest) error {
	rc := in.result
	subject := protocol.CardSubject(l.version, rc.card.ProjectID, rc.card.CardID)
	sc, cached := l.cache.cards.get(subject)
	if !cached {
		rec, _, err := l.recordCached(ctx, callKey(in.project, in.id.AgentTurnID, in.id.ToolCallID))
		if err != nil {
			return fmt.Errorf("report.result %s/%s: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
		}
		if rec != nil && rec.State == protocol.StateDispatched {
			return nil
		}
		m, err := l.lastForSubject(ctx, subject)
		if err != nil {
			return fmt.Errorf("report.result %s/%s: read card: %w", in.id.AgentTurnID, in.id.ToolCallID, err)
		}
		if m == nil {
			return nil
		}
		return l.compareStoredCard(ctx, by, in, m, raw)
	}
	data, err := json.Marshal(&sc.Card)
	if err != nil {
		return fmt.Errorf("report.result: encode stored card: %w", err)
	}
	if !bytes.Equal(data, rc.stored) {
		return l.refuseCardConflict(ctx, by, in, sc.Seq, raw)
	}
	rc.held, rc.seq = true, sc.Seq
	return nil
}

// compareStoredCard compares the entry m found on the card's subject with
// the request's card: identical, the card is held; anything else is refused
// as card.put refuses it.
func (l *Ledger) compareStoredCard(ctx context.Context, by *protocol.Caller, in *reportInput, m *jetstream.RawStreamMsg, raw func() protocol.RejectedRequest) error {
	rc := in.result
	c := rc.card
	if _, ok := decodeCardEntry(m, c.ProjectID, c.CardID); !ok {
		// Not the ledger's: the ledger's card, if any, is the first message.
		first, err := l.firstForSubject(ctx, m.Subject)
		if err != nil {
			return fmt.Errorf("report.result: card %s exists but cannot be read: %w", c.CardID, err)
		}
		if first != nil {
			m = first
		}
	}
	if _, ok := decodeCardEntry(m, c.ProjectID, c.CardID); !ok {
		var vs protocol.Violations
		vs.Add("body.card.card_id", protocol.VConflict, "the subject of card %s holds a message that is not a card entry (ledger seq %d); choose another card_id", c.CardID, m.Sequence)
		return l.reject(ctx, by, protocol.OpReportResult, in.project, in.channel, protocol.NewError(protocol.CodeConflict, vs, "card id %s is taken by a foreign message", c.CardID), raw())
	}
	if !bytes.Equal(m.Data, rc.stored) {
		return l.refuseCardConflict(ctx, by, in, m.Sequence, raw)
	}
	rc.held, rc.seq = true, m.Sequence
	l.cache.cards.put(m.Subject, &protocol.StoredCard{Card: *c, Seq: m.Sequence, Time: m.Time.UTC()})
	return nil
}

// refuseCardConflict refuses a report.result whose card id holds another
// card, as card.put refuses a different card under an existing id.
func (l *Ledger) refuseCardConflict(ctx context.Context, by *protocol.Caller, in *reportInput, seq uint64, raw func() protocol.RejectedRequest) error {
	c := in.result.card
	var vs protocol.Violations
	vs.Add("body.card.card_id", protocol.VConflict, "card %s already exists at ledger seq %d with different content; cards are immutable", c.CardID, seq)
	return l.reject(ctx, by, protocol.OpReportResult, in.project, in.channel, protocol.NewError(protocol.CodeConflict, vs, "card %s already exists with different content", c.CardID), raw())
}

// resultRefusal carries a refusal of a report.result found at its append
// (the card's id holds another card) out of the report core unwrapped.
type resultRefusal struct{ err error }

func (r *resultRefusal) Error() string { return r.err.Error() }
func (r *resultRefusal) Unwrap() error { return r.err }

// resultPaths names a refusal's fields as a report.result's body has them:
// the report core names the card card.* and the report payload.*.
func resultPaths(e *protocol.Error) *protocol.Error {
	if len(e.Violations) == 0 {
		return e
	}
	out := *e
	out.Violations = make(protocol.Violations, len(e.Violations))
	for i, v := range e.Violations {
		switch {
		case v.Field == "payload" || strings.HasPrefix(v.Field, "payload."):
			v.Field = "body.report" + strings.TrimPrefix(v.Field, "payload")
		case strings.HasPrefix(v.Field, "card."):
			v.Field = "body." + v.Field
		}
		out.Violations[i] = v
	}
	return &out
}

// appendResult is the report core's append for a report of any kind: a
// report.result whose card is not stored yet appends card and report as
// one atomic batch; any other report (and a report.result whose card is
// held) appends the report entry alone (appendReport). Its results are
// appendReport's.
func (l *Ledger) appendResult(ctx context.Context, by *protocol.Caller, in *reportInput, toolLabel string, c *protocol.Claim, raw func() protocol.RejectedRequest) (uint64, *protocol.Claim, error) {
	rc := in.result
	if rc == nil || rc.held {
		return l.appendReport(ctx, by, toolLabel, c)
	}
	if err := l.step(stepResultChecked); err != nil {
		return 0, nil, err
	}
	if l.sequentialResults {
		return l.appendSequential(ctx, by, in, toolLabel, c, raw)
	}
	seq, err := l.appendBatch(ctx, by, rc, c)
	if err == nil {
		rc.seq = seq - 1
		l.countReport(toolLabel, c)
		return seq, nil, nil
	}
	if !isWrongLastSeq(err) && !isBatchDuplicate(err) {
		return 0, nil, err
	}
	// One of the two subjects holds an entry (the card's, or the report's,
	// whose Nats-Msg-Id may still be in the duplicate window): the batch
	// stored nothing. The card decides first; then the report goes on as
	// appendReport's refused append does. A read can reach a server that
	// has not applied the entry yet (a leader elected in between): it reads
	// again until one shows, and never appends the report without its card.
	for wait := backoff.New(time.Millisecond, 50*time.Millisecond); ; {
		m, gerr := l.lastForSubject(ctx, protocol.CardSubject(l.version, rc.card.ProjectID, rc.card.CardID))
		if gerr == nil && m != nil {
			if err := l.compareStoredCard(ctx, by, in, m, raw); err != nil {
				if _, ok := protocol.AsError(err); ok {
					return 0, nil, &resultRefusal{err: err}
				}
				return 0, nil, err
			}
			// The card is held: the report alone, whose append finds the
			// stored report if there is one.
			return l.appendHeld(ctx, by, rc, toolLabel, c)
		}
		if gerr == nil {
			existing, rerr := l.lastForSubject(ctx, c.Subject)
			if rerr == nil && existing != nil {
				stored, cerr := l.claimFromEntry(existing)
				if cerr != nil {
					return 0, nil, cerr
				}
				return existing.Sequence, stored, nil
			}
			gerr = rerr
		}
		if werr := wait.Wait(ctx); werr != nil {
			return 0, nil, fmt.Errorf("%w (a refused atomic batch (%v) whose card and report no read found; last read: %v)", werr, err, gerr)
		}
	}
}

// appendHeld appends the report entry alone, its card stored (rc.seq):
// the ledger knows the card's sequence now, so the entry carries it, as a
// report's does.
func (l *Ledger) appendHeld(ctx context.Context, by *protocol.Caller, rc *resultCard, toolLabel string, c *protocol.Claim) (uint64, *protocol.Claim, error) {
	var re protocol.ReportEntry
	if rc.entry != nil {
		re = *rc.entry
	} else if err := json.Unmarshal(c.Data, &re); err != nil {
		// A claim not built here (an earlier version's, from the record).
		return 0, nil, fmt.Errorf("report.result: decode own entry: %w", err)
	}
	re.ToolResultCardSeq = rc.seq
	data, err := json.Marshal(re)
	if err != nil {
		return 0, nil, fmt.Errorf("report.result: encode entry: %w", err)
	}
	c.Data = data
	return l.appendReport(ctx, by, toolLabel, c)
}

// appendSequential is appendResult when Config.ResultWrites resolves to sequential: the
// card's append (expected-last-subject-sequence 0, as card.put's), then the
// report's. A card id already holding a card is compared as after a
// refused batch: identical, it is held; different, the request is refused.
func (l *Ledger) appendSequential(ctx context.Context, by *protocol.Caller, in *reportInput, toolLabel string, c *protocol.Claim, raw func() protocol.RejectedRequest) (uint64, *protocol.Claim, error) {
	rc := in.result
	msg := &nats.Msg{Subject: protocol.CardSubject(l.version, rc.card.ProjectID, rc.card.CardID), Data: rc.stored, Header: nats.Header{}}
	msg.Header.Set(protocol.HeaderProjectID, rc.card.ProjectID)
	msg.Header.Set(protocol.HeaderAgentTurnID, rc.card.AgentTurnID)
	msg.Header.Set(protocol.HeaderToolCallID, rc.card.ToolCallID)
	// The card takes the report's time (fixed by its claim, before either
	// is appended): the report is never older than its card.
	msg.Header.Set(protocol.HeaderTime, protocol.HeaderGet(c.Header, protocol.HeaderTime))
	ack, err := l.appendEntry(ctx, by, protocol.KindCard, msg, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case err == nil:
		rc.seq = ack.Sequence
		l.cache.cards.put(msg.Subject, &protocol.StoredCard{Card: *rc.card, Seq: ack.Sequence})
	case isWrongLastSeq(err):
		m, gerr := l.storedEntry(ctx, msg.Subject)
		if gerr != nil {
			return 0, nil, fmt.Errorf("report.result: card %s exists but cannot be read: %w", rc.card.CardID, gerr)
		}
		if err := l.compareStoredCard(ctx, by, in, m, raw); err != nil {
			if _, ok := protocol.AsError(err); ok {
				return 0, nil, &resultRefusal{err: err}
			}
			return 0, nil, err
		}
	default:
		return 0, nil, fmt.Errorf("report.result: append card %s: %w", rc.card.CardID, err)
	}
	return l.appendHeld(ctx, by, rc, toolLabel, c)
}

// countReport counts an accepted report, as appendReport does for the one
// process that stored its entry.
func (l *Ledger) countReport(toolLabel string, c *protocol.Claim) {
	l.m.reports.WithLabelValues(c.Status).Inc()
	l.m.toolCalls.WithLabelValues(toolLabel, c.Status, ErrorCodeLabel(c.ErrorCode)).Inc()
	if c.AttemptOutcome != "" {
		l.m.attemptOutcome.WithLabelValues(c.AttemptOutcome).Inc()
	}
}

// JetStream's answers to an atomic batch that matter here (nats-server
// jetstream_errors_generated.go).
const (
	jsBatchContainsDuplicate = 10201 // a message's Nats-Msg-Id is in the duplicate window
	jsBatchIncomplete        = 10176 // a message of the batch did not arrive (or timed out)
	jsBatchTooManyInflight   = 10210 // too many batches open on the stream or server
)

func isBatchDuplicate(err error) bool { return jsCode(err) == jsBatchContainsDuplicate }

func jsCode(err error) jetstream.ErrorCode {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode
	}
	return 0
}

// appendBatch publishes the card and the report entry as one atomic batch
// and returns the report's sequence (the card's is the one before: a batch
// is stored contiguously). Each entry keeps its own check: the card's and
// the report's subjects must be empty (expected-last-subject-sequence 0),
// so a lost race stores neither. A batch the server could not take whole
// (a message lost on the way, too many batches open) is sent again under a
// new id; an undecided one (isUndecided) too, as every write is.
func (l *Ledger) appendBatch(ctx context.Context, by *protocol.Caller, rc *resultCard, c *protocol.Claim) (uint64, error) {
	if err := l.writable(); err != nil {
		return 0, err
	}
	card := &nats.Msg{Subject: protocol.CardSubject(l.version, rc.card.ProjectID, rc.card.CardID), Data: rc.stored, Header: nats.Header{}}
	card.Header.Set(protocol.HeaderProjectID, rc.card.ProjectID)
	card.Header.Set(protocol.HeaderAgentTurnID, rc.card.AgentTurnID)
	card.Header.Set(protocol.HeaderToolCallID, rc.card.ToolCallID)
	// The card takes the report's time (fixed by its claim, before
	// either is stored): the report is never older than its card.
	card.Header.Set(protocol.HeaderTime, protocol.HeaderGet(c.Header, protocol.HeaderTime))
	report := &nats.Msg{Subject: c.Subject, Data: c.Data, Header: nats.Header{}}
	for k, v := range c.Header {
		report.Header[k] = append([]string(nil), v...)
	}
	report.Header.Set(protocol.HeaderMsgID, c.MsgID)
	start := time.Now()
	for _, e := range []struct {
		kind protocol.EntryKind
		msg  *nats.Msg
	}{{protocol.KindCard, card}, {protocol.KindReport, report}} {
		e.msg.Header.Set(protocol.HeaderEntryKind, string(e.kind))
		l.expire(e.kind, e.msg)
		if by != nil && by.Actor != "" {
			e.msg.Header.Set(protocol.HeaderActor, by.Actor)
		}
		if e.msg.Header.Get(protocol.HeaderTime) == "" {
			e.msg.Header.Set(protocol.HeaderTime, protocol.FormatTime(start))
		}
		e.msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		e.msg.Header.Set(jetstream.ExpectedStreamHeader, l.streams.Stream)
	}
	var seq uint64
	err := func() error {
		for wait := backoff.New(time.Millisecond, 50*time.Millisecond); ; {
			s, err := untilDecided(ctx, func() (uint64, error) { return l.results.submit(ctx, l, card, report) })
			switch jsCode(err) {
			case jsBatchIncomplete, jsBatchTooManyInflight:
				if werr := wait.Wait(ctx); werr != nil {
					return fmt.Errorf("%w (atomic batch not taken: %v)", werr, err)
				}
				continue
			}
			seq = s
			return err
		}
	}()
	l.fault.note(err)
	if err != nil {
		return 0, err
	}
	l.m.appendLatency.WithLabelValues(string(protocol.KindReport)).Observe(time.Since(start).Seconds())
	l.m.appends.WithLabelValues(string(protocol.KindCard)).Inc()
	l.m.appends.WithLabelValues(string(protocol.KindReport)).Inc()
	l.cache.cards.put(card.Subject, &protocol.StoredCard{Card: *rc.card, Seq: seq - 1})
	return seq, nil
}

// resultBatcher groups the atomic batches of concurrent report.results
// into one: nats-server stages an R1 file-stored batch in a file store of
// its own and syncs it before the commit, so a batch costs a disk sync, and
// one batch of many calls' cards and reports costs one. While a batch is in
// flight the next ones wait and go together. A group refused for any reason
// (one call's lost race refuses all of it) is sent again one call at a
// time, so each call gets its own answer, as if it had been alone.
type resultBatcher struct {
	mu      sync.Mutex
	pending []*batchItem
	running bool
}

// batchItem is one call's card and report waiting for a batch.
type batchItem struct {
	card, report *nats.Msg
	done         chan batchDone
}

type batchDone struct {
	seq uint64
	err error
}

// maxGroup bounds the calls of one grouped batch (two messages each; the
// server's default limit is 1000 messages).
const maxGroup = 64

// submit sends card and report in an atomic batch, grouped with others
// waiting, and returns the report's sequence.
func (b *resultBatcher) submit(ctx context.Context, l *Ledger, card, report *nats.Msg) (uint64, error) {
	it := &batchItem{card: card, report: report, done: make(chan batchDone, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, it)
	if !b.running {
		b.running = true
		go b.run(l)
	}
	b.mu.Unlock()
	select {
	case d := <-it.done:
		return d.seq, d.err
	case <-ctx.Done():
		// The batch may still be stored: a retry finds it (appendResult).
		return 0, fmt.Errorf("atomic batch: %w", ctx.Err())
	}
}

// run sends the waiting items, a group at a time, until none wait.
func (b *resultBatcher) run(l *Ledger) {
	for {
		b.mu.Lock()
		n := min(len(b.pending), maxGroup)
		if n == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		group := b.pending[:n:n]
		b.pending = b.pending[n:]
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		b.send(ctx, l, group)
		cancel()
	}
}

// send publishes group as one atomic batch and answers each item; a
// refused group of more than one is sent again an item at a time.
func (b *resultBatcher) send(ctx context.Context, l *Ledger, group []*batchItem) {
	msgs := make([]*nats.Msg, 0, 2*len(group))
	for _, it := range group {
		msgs = append(msgs, it.card, it.report)
	}
	last, err := l.publishBatch(ctx, msgs)
	if err == nil {
		for i, it := range group {
			it.done <- batchDone{seq: last - 2*uint64(len(group)-1-i)}
		}
		return
	}
	if len(group) == 1 {
		group[0].done <- batchDone{err: err}
		return
	}
	var wg sync.WaitGroup
	for _, it := range group {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := l.publishBatch(ctx, []*nats.Msg{it.card, it.report})
			it.done <- batchDone{seq: s, err: err}
		}()
	}
	wg.Wait()
}

// publishBatch sends msgs as one atomic batch under a new batch id: every
// message but the last without a reply (its staging needs no answer; a lost
// one fails the commit as incomplete), the last as the commit, whose
// acknowledgement is the batch's. It returns the last message's sequence (a
// batch is stored contiguously).
func (l *Ledger) publishBatch(ctx context.Context, msgs []*nats.Msg) (uint64, error) {
	id := nuid.Next()
	nc := l.js.Conn()
	for i, m := range msgs {
		m.Header.Set(batchIDHeader, id)
		m.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		m.Header.Del(batchCommitHeader)
		if i < len(msgs)-1 {
			if err := nc.PublishMsg(m); err != nil {
				return 0, fmt.Errorf("atomic batch: publish: %w", err)
			}
		}
	}
	commit := msgs[len(msgs)-1]
	commit.Header.Set(batchCommitHeader, "1")
	resp, err := nc.RequestMsgWithContext(ctx, commit)
	if err != nil {
		return 0, fmt.Errorf("atomic batch: commit: %w", err)
	}
	var ack struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		jetstream.PubAck
	}
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return 0, fmt.Errorf("atomic batch: decode acknowledgement: %w", err)
	}
	if ack.Error != nil {
		return 0, ack.Error
	}
	if ack.Sequence < uint64(len(msgs)) {
		return 0, fmt.Errorf("atomic batch: acknowledgement without a sequence: %s", strconv.Quote(string(resp.Data)))
	}
	return ack.Sequence, nil
}

// JetStream's atomic batch headers (nats-server 2.12 and later; nats.go
// has no names for them): the batch's id (at most 64 characters), each
// message's place in it from 1, and the commit on the last ("1").
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)
