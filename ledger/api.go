package ledger

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
)

// APIConfig configures the request/reply API. Zero values mean the defaults.
type APIConfig struct {
	// QueueGroup shares requests among every serving process. Empty means
	// "cgledger-api".
	QueueGroup string
	// RequestTimeout bounds the work done for one request. Zero means 30s.
	RequestTimeout time.Duration
	// MaxInFlight bounds concurrently handled requests. Zero means 256.
	MaxInFlight int
}

// APIServer serves the ledger API until Stop.
type APIServer struct {
	l    *Ledger
	cfg  APIConfig
	subs []*nats.Subscription
	sem  chan struct{}
	wg   sync.WaitGroup
	ctx  context.Context
	stop context.CancelFunc

	mu      sync.Mutex
	stopped bool
}

// apiHandler serves one operation's request m for by, the caller its API
// subject names, checked once before (protocol.CheckRequest): never nil.
type apiHandler func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error)

// ServeAPI subscribes the API subjects (in a queue group) and serves them
// with this ledger. ctx bounds the server's life as Stop does.
func (l *Ledger) ServeAPI(ctx context.Context, cfg APIConfig) (*APIServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ledger api: %w", err)
	}
	if cfg.QueueGroup == "" {
		cfg.QueueGroup = "cgledger-api"
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 256
	}
	sctx, stop := context.WithCancel(ctx)
	s := &APIServer{l: l, cfg: cfg, sem: make(chan struct{}, cfg.MaxInFlight), ctx: sctx, stop: stop}
	handlers := map[string]apiHandler{
		protocol.OpCardPut: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.putCardJSON(ctx, by, m.Data)
		},
		protocol.OpCardGet: s.cardGet,
		protocol.OpDispatch: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.dispatchMsg(ctx, by, &apiRequest{op: protocol.OpDispatch, c: *by, m: m}, m.Header, m.Data)
		},
		protocol.OpReport: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.reportMsg(ctx, by, m.Header, m.Data)
		},
		protocol.OpReportResult: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.reportResultMsg(ctx, by, &apiRequest{op: protocol.OpReportResult, c: *by, m: m}, m.Header, m.Data)
		},
		protocol.OpRosterSet: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.setRosterJSON(ctx, by, m.Data)
		},
		protocol.OpRosterGet: s.rosterGet,
		protocol.OpCallGet:   s.callGet,
		protocol.OpConsume: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.consumeJSON(ctx, by, m.Data)
		},
		protocol.OpToolRegister: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.registerToolMsg(ctx, by, by.Project, m.Header, m.Data)
		},
		protocol.OpCancel: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.cancelJSON(ctx, by, m.Data)
		},
		protocol.OpToolGet:       s.toolGet,
		protocol.OpToolList:      s.toolList,
		protocol.OpToolConsumer:  s.toolConsumer,
		protocol.OpProjectorSkip: s.projectorSkip,
		protocol.OpCancelGet:     s.cancelGet,
		protocol.OpResume:        s.resume,
		protocol.OpCommandReject: s.commandReject,
		protocol.OpAttemptStart: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.startAttemptJSON(ctx, by, m.Header, m.Data)
		},
		protocol.OpPrepare: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.prepareJSON(ctx, by, m.Header, m.Data)
		},
		protocol.OpCommit: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.decideJSON(ctx, by, protocol.OpCommit, m.Header, m.Data)
		},
		protocol.OpAbort: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.decideJSON(ctx, by, protocol.OpAbort, m.Header, m.Data)
		},
		protocol.OpApprove: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.approvalJSON(ctx, by, protocol.OpApprove, by.Actor, m.Data)
		},
		protocol.OpDeny: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.approvalJSON(ctx, by, protocol.OpDeny, by.Actor, m.Data)
		},
		protocol.OpCallCancel: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.operatorCancelJSON(ctx, by, by.Actor, m.Data)
		},
		protocol.OpCallResolve: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.resolveJSON(ctx, by, by.Actor, m.Data)
		},
		protocol.OpCallRedrive: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.redriveJSON(ctx, by, by.Actor, m.Data)
		},
		protocol.OpToolPause: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.toolPauseJSON(ctx, by, protocol.OpToolPause, by.Actor, m.Data)
		},
		protocol.OpConformanceCommand: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.conformanceCommandJSON(ctx, by, m.Data)
		},
		protocol.OpConformanceObserve: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			req, vs := protocol.ParseConformanceObserve(m.Data)
			if err := protocol.BadRequest(protocol.OpConformanceObserve+" request", vs); err != nil {
				return nil, err
			}
			return l.ConformanceObserve(ctx, req)
		},
		protocol.OpToolResume: func(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
			return l.toolPauseJSON(ctx, by, protocol.OpToolResume, by.Actor, m.Data)
		},
	}
	ops := make([]string, 0, len(handlers))
	for op := range handlers {
		ops = append(ops, op)
	}
	if err := protocol.CheckServed(protocol.ServerLedger, ops); err != nil {
		s.stop()
		return nil, fmt.Errorf("ledger api: %w", err)
	}
	for op, h := range handlers {
		subj := protocol.APISubject("*", "*", op)
		sub, err := l.nc.QueueSubscribe(subj, cfg.QueueGroup, s.handle(op, h))
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("ledger api: subscribe %s: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	if err := l.nc.Flush(); err != nil {
		s.Stop()
		return nil, fmt.Errorf("ledger api: flush subscriptions: %w", err)
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

// caller reads the project and actor from an API subject and checks the
// request against them. A refusal of a write is recorded like any other.
//
// The caller check of dispatch and report.result waits for their parse
// (protocol.CheckRequestBeforeParse): their handler runs it
// (Ledger.callerChecked), so that the body is decoded once.
func (s *APIServer) caller(ctx context.Context, op string, m *nats.Msg) (protocol.Caller, error) {
	c, e, badReply := protocol.CheckRequestBeforeParse(op, m)
	if badReply {
		// Answering would publish the reply wherever the requester chose,
		// a ledger subject included: refuse, record, and send nothing.
		m.Reply = ""
	}
	if e == nil {
		return c, nil
	}
	if !protocol.IsWrite(op) && m.Reply != "" {
		return c, e
	}
	err := s.l.RecordRefusal(ctx, op, c, m, e)
	if protocol.IsOperatorAction(op) {
		// Refused before the op's own handler (another project's admin,
		// a bad block of headers): still an operator action refused.
		s.l.countOperatorAction(op, err)
	}
	return c, err
}

// apiRequest is a request on an API subject whose caller check waits for
// the operation's parse (protocol.CallerAfterParse): its caller and the
// message as received.
type apiRequest struct {
	op string
	c  protocol.Caller
	m  *nats.Msg
}

// callerChecked refuses r when vs (its caller check's violations, over
// the values its parse found or, when the parse failed, over its bytes)
// is not empty, exactly as APIServer.caller refuses a request whose check
// runs first; nil r (a request not on an API subject) is not checked.
func (l *Ledger) callerChecked(ctx context.Context, r *apiRequest, vs func() protocol.Violations) error {
	if r == nil {
		return nil
	}
	if v := vs(); len(v) > 0 {
		return l.RecordRefusal(ctx, r.op, r.c, r.m, protocol.CallerRefusal(r.op, v))
	}
	return nil
}

// bytesCaller is r's caller check over its bytes (protocol.CheckCaller),
// for a request whose parse failed.
func (r *apiRequest) bytesCaller() protocol.Violations {
	return protocol.CheckCaller(r.op, r.c, r.m.Header, r.m.Data)
}

// RecordRefusal writes the rejection entry of a request on an API subject
// refused by its checks (protocol.CheckReadRequest's refusal), as the API server
// records its own: under the subject's project, the request as received.
// The API server records every write's, and a read's that nobody can be told
// of (no reply subject, or one that is not an inbox): another part of the
// server that answers a read (the views answer inbox.list) calls it when
// protocol.CheckReadRequest says answer=false with a refusal. It returns e with its
// rejection_seq, or the failure to write it (wrapping e).
func (l *Ledger) RecordRefusal(ctx context.Context, op string, c protocol.Caller, m *nats.Msg, e *protocol.Error) error {
	project := ""
	if protocol.ValidIdentifier(c.Project) {
		project = c.Project
	}
	return l.reject(ctx, &c, op, project, "", e, protocol.NewRejectedRequest("", m.Header, m.Data))
}

func (s *APIServer) handle(op string, h apiHandler) nats.MsgHandler {
	return func(m *nats.Msg) {
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
			start := time.Now()
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.RequestTimeout)
			defer cancel()
			c, err := s.caller(ctx, op, m)
			var res any
			if err == nil {
				res, err = h(ctx, &c, m)
			}
			code := "ok"
			if err != nil {
				code = string(protocol.CodeInternal)
				if e, ok := protocol.AsError(err); ok {
					code = string(e.Code)
				}
			}
			s.l.m.apiRequests.WithLabelValues(op, code).Inc()
			s.l.m.apiDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
			if m.Reply == "" {
				return
			}
			if rerr := m.Respond(protocol.EncodeReply(res, err)); rerr != nil {
				s.l.log.Warn("api reply not sent", "subject", m.Subject, "err", rerr)
			}
		}()
	}
}

func (s *APIServer) cardGet(ctx context.Context, _ *protocol.Caller, m *nats.Msg) (any, error) {
	r, vs := protocol.ParseCardGetRequest(m.Data)
	project, ids := r.ProjectID, r.CardIDs
	if err := protocol.BadRequest("card.get request", vs); err != nil {
		return nil, err
	}
	cards, missing, err := s.l.GetCards(ctx, project, ids)
	if err != nil {
		return nil, err
	}
	if cards == nil {
		cards = []protocol.StoredCard{}
	}
	if missing == nil {
		missing = []string{}
	}
	return struct {
		Cards   []protocol.StoredCard `json:"cards"`
		Missing []string              `json:"missing"`
	}{cards, missing}, nil
}

func (s *APIServer) rosterGet(ctx context.Context, _ *protocol.Caller, m *nats.Msg) (any, error) {
	r, vs := protocol.ParseRosterGetRequest(m.Data)
	project, agent := r.ProjectID, r.AgentID
	if err := protocol.BadRequest("roster.get request", vs); err != nil {
		return nil, err
	}
	return s.l.GetRoster(ctx, project, agent)
}

func (s *APIServer) callGet(ctx context.Context, _ *protocol.Caller, m *nats.Msg) (any, error) {
	r, vs := protocol.ParseCallGetRequest(m.Data)
	project, turn, call, twoPhase := r.ProjectID, r.AgentTurnID, r.ToolCallID, r.TwoPhase
	if err := protocol.BadRequest("call.get request", vs); err != nil {
		return nil, err
	}
	rec, err := s.l.GetCall(ctx, project, turn, call)
	if err != nil {
		return rec, err
	}
	view := protocol.CallView{CallRecord: *rec}
	if view.Resolution, err = s.l.callResolution(ctx, rec); err != nil {
		return nil, err
	}
	if view.Redrive, err = s.l.callRedrive(ctx, rec); err != nil {
		return nil, err
	}
	view.RedrivenFrom, _ = protocol.RedrivenFrom(rec.ToolCallID)
	if twoPhase {
		// Only on request: the two reads stay off the path of every other call.
		if view.TwoPhase, err = s.l.twoPhase(ctx, rec); err != nil {
			return nil, err
		}
	}
	return view, nil
}

func (s *APIServer) cancelGet(ctx context.Context, _ *protocol.Caller, m *nats.Msg) (any, error) {
	r, vs := protocol.ParseCancelGetRequest(m.Data)
	if err := protocol.BadRequest("cancel.get request", vs); err != nil {
		return nil, err
	}
	canceled, err := s.l.Canceled(ctx, r.ProjectID, r.ChannelID, r.AgentTurnID, r.ToolCallID)
	return protocol.CancelState{Canceled: canceled}, err
}

// resume serves report.resume. A body that does not read is refused and
// recorded like any write's; the outcomes of Resume itself (not_reported,
// unknown_call, or a report refused on the way) are its own.
func (s *APIServer) resume(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
	r, vs := protocol.ParseResumeRequest(m.Data)
	if len(vs) > 0 {
		e := protocol.NewError(protocol.CodeBadRequest, vs, "invalid report.resume request: %d violation(s)", len(vs))
		return nil, s.l.reject(ctx, by, protocol.OpResume, r.ProjectID, protocol.Unrouted, e, protocol.NewRejectedRequest("", m.Header, m.Data))
	}
	// Checked here, before the stored report is replayed: a refusal then
	// records this request, not the report it would have replayed.
	rec, err := s.l.GetCall(ctx, r.ProjectID, r.AgentTurnID, r.ToolCallID)
	if err != nil {
		return nil, err
	}
	if vs := callerOwnsCall(by, rec); len(vs) > 0 {
		e := protocol.NewError(protocol.CodeForbidden, vs, "report.resume of call %s by another tool", r.ToolCallID)
		return nil, s.l.reject(ctx, by, protocol.OpResume, r.ProjectID, rec.ChannelID, e, protocol.NewRejectedRequest("", m.Header, m.Data))
	}
	return s.l.resume(ctx, by, r.ProjectID, r.AgentTurnID, r.ToolCallID)
}

// commandReject serves command.reject: an executor in another process
// records a command it refused, as RejectCommand does in process.
func (s *APIServer) commandReject(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
	r, vs := protocol.ParseCommandRejection(m.Data)
	if len(vs) > 0 {
		e := protocol.NewError(protocol.CodeBadRequest, vs, "invalid command.reject request: %d violation(s)", len(vs))
		return nil, s.l.reject(ctx, by, protocol.OpCommandReject, "", protocol.Unrouted, e, protocol.NewRejectedRequest("", m.Header, m.Data))
	}
	dup, err := s.l.rejectCommand(ctx, by, r.Subject, nats.Header(r.Headers), r.Data, r.Error)
	if err != nil {
		return nil, err
	}
	return protocol.RejectionResult{Seq: r.Error.Seq, Duplicate: dup}, nil
}

func (s *APIServer) toolGet(ctx context.Context, _ *protocol.Caller, m *nats.Msg) (any, error) {
	r, vs := protocol.ParseToolGetRequest(m.Data)
	project, tool, seq := r.ProjectID, r.ToolName, r.Seq
	if err := protocol.BadRequest("tool.get request", vs); err != nil {
		return nil, err
	}
	if seq != 0 {
		return s.l.GetToolAt(ctx, project, tool, seq)
	}
	return s.l.GetTool(ctx, project, tool)
}

func (s *APIServer) toolList(ctx context.Context, _ *protocol.Caller, m *nats.Msg) (any, error) {
	project, vs := protocol.ParseToolListRequest(m.Data)
	if err := protocol.BadRequest("tool.list request", vs); err != nil {
		return nil, err
	}
	tools, err := s.l.ListTools(ctx, project)
	return struct {
		Tools []protocol.StoredTool `json:"tools"`
	}{tools}, err
}

// EnsureToolConsumer creates (or finds) the durable consumer of a project's
// tool target, which must be the target of a registered tool (else
// not_found) or a PMO built-in (its cmd.sys.pmo.internal commands): the
// only JetStream consumer a tool credential may pull from,
// so a tool service in any language gets durable, redelivered commands
// without any right to the JetStream API beyond it.
func (l *Ledger) EnsureToolConsumer(ctx context.Context, project, tool string) (protocol.ToolConsumer, error) {
	var vs protocol.Violations
	protocol.CheckIdent(&vs, "subject", project, true)
	protocol.CheckIdent(&vs, "subject", tool, true)
	if err := protocol.BadRequest("tool.consumer request", vs); err != nil {
		return protocol.ToolConsumer{}, err
	}
	if protocol.IsPMOTool(tool) {
		// A PMO built-in is served in every project without a
		// registration; only a credential issued for it asks.
		return l.ensureConsumer(ctx, project, tool, protocol.PMOCommandsFilter(l.version, project, tool))
	}
	// Only tools an admin registered get a consumer: each one is a resource
	// of the stream (which caps consumers), not something any tool
	// credential may mint.
	tools, err := l.ListTools(ctx, project)
	if err != nil {
		return protocol.ToolConsumer{}, fmt.Errorf("tool consumer: %w", err)
	}
	registered := false
	for _, t := range tools {
		if sub, err := protocol.ParseSubject(t.Definition.TargetFor(project, "c")); err == nil && len(sub.Target) > 0 && sub.Target[0] == tool {
			registered = true
			break
		}
	}
	if !registered {
		vs.Add("subject", protocol.VNotFound, "no tool registered in project %s has target %q (%s...): register it first", project, tool, protocol.ToolTargetTemplate(tool))
		return protocol.ToolConsumer{}, protocol.NewError(protocol.CodeNotFound, vs, "no registered tool with target %s", tool)
	}
	return l.ensureConsumer(ctx, project, tool, protocol.ToolCommandSubject(l.version, project, "*", tool), protocol.ToolCommandSubject(l.version, project, "*", tool, ">"))
}

// ensureConsumer creates (or finds) the durable consumer of a tool's
// commands, named for the tool credential that may pull it.
func (l *Ledger) ensureConsumer(ctx context.Context, project, tool string, filters ...string) (protocol.ToolConsumer, error) {
	name := auth.ToolConsumerName(project, tool)
	if err := l.checkConsumerQuota(ctx, project, name); err != nil {
		return protocol.ToolConsumer{}, err
	}
	tc := protocol.ToolConsumer{Stream: l.streams.Stream, Consumer: name, FilterSubjects: filters, APIPrefix: auth.ToolJSAPIPrefix}
	cons, err := l.js.CreateOrUpdateConsumer(ctx, l.streams.Stream, jetstream.ConsumerConfig{
		Durable:        tc.Consumer,
		Description:    "cgledger: commands of tool " + protocol.Clip(tool) + " in project " + protocol.Clip(project),
		FilterSubjects: tc.FilterSubjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        l.toolAckWait,
		// Unlimited: a command is never dropped while its tool service
		// cannot get an outcome stored (docs/protocol.md); a service that
		// gives up on a command reports it failed, then acks it.
		MaxDeliver:    -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// JetStream's defaults, written down: services size their pulls
		// by them (the answer carries them), so they are part of the
		// protocol rather than whatever the server defaults to.
		MaxAckPending: toolMaxAckPending,
		MaxWaiting:    toolMaxWaiting,
		Metadata:      map[string]string{consumerProjectKey: project, "cgledger.tool": tool},
	})
	if err != nil {
		return protocol.ToolConsumer{}, fmt.Errorf("tool consumer %s: %w", tc.Consumer, err)
	}
	// As the server holds them, which is what a pull runs into.
	cfg := cons.CachedInfo().Config
	tc.MaxAckPending, tc.MaxWaiting, tc.AckWaitMS = cfg.MaxAckPending, cfg.MaxWaiting, cfg.AckWait.Milliseconds()
	return tc, nil
}

func (s *APIServer) toolConsumer(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
	// The body names nothing (the subject does), but what is sent must be
	// the documented object; an empty body is the same as {}.
	if err := protocol.BadRequest("tool.consumer request", protocol.ParseToolConsumerRequest(m.Data)); err != nil {
		return nil, err
	}
	return s.l.EnsureToolConsumer(ctx, by.Project, by.Actor)
}

func (s *APIServer) projectorSkip(ctx context.Context, by *protocol.Caller, m *nats.Msg) (any, error) {
	req, vs := protocol.ParseSkipRequest(m.Data)
	if err := protocol.BadRequest("projector.skip request", vs); err != nil {
		return nil, err
	}
	return s.l.skip(ctx, by, req.Seq, req.Reason)
}

// Tool consumer quotas. The server caps the consumers of an account, and
// export, verify, the projector and the executors need consumers too: one
// project (an admin may register any number of tools) must not be able to
// take them all.
const (
	// MaxToolConsumersPerProject bounds one project's tool consumers.
	MaxToolConsumersPerProject = 32
	// MaxToolConsumers bounds all tool consumers of the ledger stream.
	MaxToolConsumers = 512

	consumerProjectKey = "cgledger.project"

	// Pull limits of a tool consumer (protocol.ToolConsumer).
	toolMaxAckPending = 1000
	toolMaxWaiting    = 512
)

// checkConsumerQuota refuses a new tool consumer past the quotas; an
// existing one (name) is always answered.
func (l *Ledger) checkConsumerQuota(ctx context.Context, project, name string) error {
	perProject, total := 0, 0
	lister := l.stream.ListConsumers(ctx)
	for info := range lister.Info() {
		if info.Name == name {
			return nil
		}
		if !strings.HasPrefix(info.Name, "cgtool-") {
			continue
		}
		total++
		if info.Config.Metadata[consumerProjectKey] == project {
			perProject++
		}
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("tool consumer quota: %w", err)
	}
	var vs protocol.Violations
	switch {
	case perProject >= MaxToolConsumersPerProject:
		vs.Add("subject", protocol.VTooLarge, "project %s already has %d tool consumers, the most a project may have", project, perProject)
	case total >= MaxToolConsumers:
		vs.Add("subject", protocol.VTooLarge, "the ledger already has %d tool consumers, the most it keeps", total)
	default:
		return nil
	}
	return protocol.NewError(protocol.CodeBadRequest, vs, "no more tool consumers")
}
