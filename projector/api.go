package projector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/protocol"
)

// APIConfig configures the API operations the views answer. Zero values mean
// the defaults.
type APIConfig struct {
	// QueueGroup shares requests among every process that runs a projector.
	// Empty means "cgledger-api", the ledger API's group (a queue group is
	// per subject, so the two never compete for a request).
	QueueGroup string
	// RequestTimeout bounds the work done for one request. Zero means 30s.
	RequestTimeout time.Duration
	// MaxInFlight bounds concurrently handled requests. Zero means 64.
	MaxInFlight int
	// MaxWait bounds how long a request waits for the views to apply the
	// ledger's last sequence as of its arrival before it is answered from
	// the views as they stand (as_of_seq then says how far they got). Zero
	// means 5s.
	MaxWait time.Duration
	// Snapshot takes a snapshot of the views for a views.snapshot request
	// (an admin's) and answers its manifest. The views cannot take one
	// themselves: the snapshot package builds on this one, so serve passes
	// it in. Nil answers every views.snapshot with an internal error saying
	// this process takes no snapshots.
	Snapshot func(ctx context.Context) (protocol.ViewsSnapshotResult, error)
	// SnapshotList lists the snapshots for a views.snapshot.list request,
	// likewise passed in by serve; nil answers it as Snapshot's nil does.
	SnapshotList func(ctx context.Context) (protocol.ViewsSnapshotListResult, error)
	// SnapshotTimeout bounds one views.snapshot request instead of
	// RequestTimeout: a snapshot copies the whole store. Zero means 10m.
	SnapshotTimeout time.Duration
}

// viewOps are the API operations handle answers; ServeAPI checks them
// against the operation table's.
var viewOps = []string{protocol.OpInboxList, protocol.OpApprovalList, protocol.OpApprovalGet, protocol.OpViewsSnapshot, protocol.OpViewsSnapshotList}

// RefusalRecorder records the refusal of a request nobody can be told of
// (the ledger's RecordRefusal): the views write nothing themselves.
type RefusalRecorder interface {
	RecordRefusal(ctx context.Context, op string, c protocol.Caller, m *nats.Msg, e *protocol.Error) error
}

// APIServer answers inbox.list, approval.list, approval.get,
// views.snapshot and views.snapshot.list until Stop.
type APIServer struct {
	p    *Projector
	l    RefusalRecorder
	q    *Queries
	cfg  APIConfig
	subs []*nats.Subscription
	sem  chan struct{}
	wg   sync.WaitGroup
	ctx  context.Context
	stop context.CancelFunc

	mu      sync.Mutex
	stopped bool
}

// ServeAPI subscribes inbox.list, approval.list, approval.get,
// views.snapshot and views.snapshot.list (cgledger.v1.*.*.<op>, in a queue group) on nc, which must be a connection of the ledger's account (where
// the API subjects arrive), and answers it from the projector's views. l
// records the refusals nobody can be told of (no reply subject, or one that
// is not an inbox), as the ledger's API server records them for its own
// operations; it is required. Who may call which is NATS permissions'
// (internal/auth: inbox.list a worker's, the approval reads an approver's,
// auditor's or admin's, the views.snapshot operations an admin's of every project); the body's project must be the subject's. ctx bounds the server's life as Stop does.
func (p *Projector) ServeAPI(ctx context.Context, nc *nats.Conn, l RefusalRecorder, cfg APIConfig) (*APIServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("projector api: %w", err)
	}
	if l == nil {
		return nil, errors.New("projector api: a ledger is required to record the refusals it cannot answer")
	}
	if cfg.QueueGroup == "" {
		cfg.QueueGroup = "cgledger-api"
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 5 * time.Second
	}
	if cfg.SnapshotTimeout <= 0 {
		cfg.SnapshotTimeout = 10 * time.Minute
	}
	sctx, stop := context.WithCancel(ctx)
	s := &APIServer{p: p, l: l, q: NewQueries(p.store), cfg: cfg, sem: make(chan struct{}, cfg.MaxInFlight), ctx: sctx, stop: stop}
	if err := protocol.CheckServed(protocol.ServerViews, viewOps); err != nil {
		stop()
		return nil, fmt.Errorf("projector api: %w", err)
	}
	for _, op := range viewOps {
		subj := protocol.APISubject("*", "*", op)
		sub, err := nc.QueueSubscribe(subj, cfg.QueueGroup, func(m *nats.Msg) { s.handle(op, m) })
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("projector api: subscribe %s: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	if err := nc.Flush(); err != nil {
		s.Stop()
		return nil, fmt.Errorf("projector api: flush subscription: %w", err)
	}
	return s, nil
}

// Stop unsubscribes and waits for in-flight requests to finish. It is safe
// to call more than once.
func (s *APIServer) Stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.wg.Wait()
	s.stop()
}

func (s *APIServer) handle(op string, m *nats.Msg) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	select {
	case s.sem <- struct{}{}:
	case <-s.ctx.Done():
		s.wg.Done()
		return
	}
	go func() {
		defer func() { <-s.sem; s.wg.Done() }()
		timeout := s.cfg.RequestTimeout
		if op == protocol.OpViewsSnapshot {
			timeout = s.cfg.SnapshotTimeout
		}
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		defer cancel()
		c, answer, err := protocol.CheckReadRequest(op, m)
		if err == nil && !answer {
			// Nobody to answer: a read without a reply changes nothing.
			return
		}
		if e, ok := protocol.AsError(err); ok && !answer {
			// Nobody can be told (no reply subject, or one that is not an
			// inbox): the ledger records the refusal, as its API server
			// does for every other operation's.
			err = s.l.RecordRefusal(ctx, op, c, m, e)
		}
		var res any
		code := "ok"
		if err == nil {
			var asOf, ledgerSeq uint64
			switch op {
			case protocol.OpApprovalList:
				var page protocol.ApprovalListResult
				page, err = s.approvalList(ctx, c, m.Data)
				res, asOf, ledgerSeq = page, page.AsOfSeq, page.LedgerSeq
			case protocol.OpViewsSnapshot:
				res, err = s.viewsSnapshot(ctx, m.Data)
			case protocol.OpViewsSnapshotList:
				res, err = s.viewsSnapshotList(ctx, m.Data)
			case protocol.OpApprovalGet:
				var got protocol.ApprovalGetResult
				got, err = s.approvalGet(ctx, c, m.Data)
				res, asOf, ledgerSeq = got, got.AsOfSeq, got.LedgerSeq
			default:
				var page protocol.InboxListResult
				page, err = s.inboxList(ctx, c, m.Data)
				res, asOf, ledgerSeq = page, page.AsOfSeq, page.LedgerSeq
			}
			if err == nil && asOf < ledgerSeq {
				code = "stale"
			}
		}
		if err != nil {
			code = string(protocol.CodeInternal)
			if e, ok := protocol.AsError(err); ok {
				code = string(e.Code)
			}
		}
		s.p.m.apiRequests.WithLabelValues(op, code).Inc()
		if !answer {
			// Answering would publish wherever the requester chose.
			return
		}
		if rerr := m.Respond(protocol.EncodeReply(res, err)); rerr != nil {
			s.p.log.Warn("projector api: reply not sent", "subject", m.Subject, "err", rerr)
		}
	}()
}

// parseInboxList reads an inbox.list body, listing every violation.
// The cursor is checked against the listing it continues (project, agent,
// pending): one from another agent, another state or another query is
// refused here, with the other problems.
func parseInboxList(body []byte) (protocol.InboxListRequest, error) {
	var vs protocol.Violations
	var req protocol.InboxListRequest
	o, ok := protocol.ParseObject("body", body, &vs)
	if ok {
		req.ProjectID, req.AgentID = o.Ident("project_id", true), o.Ident("agent_id", true)
		req.Cursor = o.Str("cursor", false)
		req.Limit = bodyLimit(o, &vs)
		if req.Cursor != "" && protocol.ValidIdentifier(req.ProjectID) && protocol.ValidIdentifier(req.AgentID) {
			if _, err := decodeSeqCursor(req.Cursor, inboxScope(req.ProjectID, req.AgentID, InboxPending)); err != nil {
				vs.Add("body.cursor", protocol.VInvalidValue, "is not a cursor of this agent's pending results: pass the next_cursor of the page before, or leave it out for the first page")
			}
		}
	}
	if err := protocol.BadRequest("inbox.list request", vs); err != nil {
		return req, err
	}
	return req, nil
}

// bodyLimit reads a request body's optional "limit", listing a bad one.
func bodyLimit(o protocol.JSONObject, vs *protocol.Violations) int {
	// Null is absent, as for every optional field (JSONObject.Raw).
	r := o.Raw("limit")
	if r == nil {
		return 0
	}
	var v any
	d := json.NewDecoder(bytes.NewReader(r))
	d.UseNumber()
	_ = d.Decode(&v)
	n, isNum := v.(json.Number)
	i, err := n.Int64()
	switch {
	case !isNum || strings.ContainsAny(n.String(), ".eE"):
		// 1.5, 100.0 and 1e2 are numbers but not integers, as a
		// uint64 field of the other operations reads them.
		vs.Add("body.limit", protocol.VInvalidType, "must be an integer from 0 to %d (0 or none: %d)", MaxLimit, DefaultLimit)
	case err != nil || i < 0 || i > MaxLimit:
		vs.Add("body.limit", protocol.VInvalidValue, "must be an integer from 0 to %d (0 or none: %d), got %s", MaxLimit, DefaultLimit, protocol.Clip(n.String()))
	default:
		return int(i)
	}
	return 0
}

// inboxList answers one page of the caller's pending results, once the views
// have applied what the ledger held when the request arrived (or MaxWait
// has passed).
func (s *APIServer) inboxList(ctx context.Context, c protocol.Caller, body []byte) (protocol.InboxListResult, error) {
	req, err := parseInboxList(body)
	if err != nil {
		return protocol.InboxListResult{}, err
	}
	last, err := s.ledgerSeq(ctx)
	if err != nil {
		return protocol.InboxListResult{}, err
	}
	s.waitApplied(ctx, last)
	page, err := s.q.Inbox(c.Project, req.AgentID, InboxPending, AsOf{}, req.Cursor, req.Limit)
	if err != nil {
		return protocol.InboxListResult{}, err
	}
	return protocol.InboxListResult{AsOfSeq: page.AsOfSeq, LedgerSeq: last, Items: page.Items, NextCursor: page.NextCursor}, nil
}

// ledgerSeq is the ledger stream's last sequence now.
func (s *APIServer) ledgerSeq(ctx context.Context) (uint64, error) {
	st, err := s.p.js.Stream(ctx, s.p.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("read the ledger stream's last sequence: %w", err)
	}
	return st.CachedInfo().State.LastSeq, nil
}

// waitApplied waits until the views have applied seq, MaxWait has passed or
// ctx ends. The projector commits at the stream's tail at once, so a
// projector that keeps up is there within milliseconds.
func (s *APIServer) waitApplied(ctx context.Context, seq uint64) {
	if s.p.Applied() >= seq {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.MaxWait)
	defer cancel()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for s.p.Applied() < seq {
		select {
		case <-wctx.Done():
			return
		case <-t.C:
		}
	}
}
