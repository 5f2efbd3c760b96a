package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// API subjects: the ledger's operations over NATS request/reply, for clients
// in any language (docs/protocol.md, "Ledger API"). They sit outside the
// cg.> namespace so the ledger stream never captures a request.
const (
	APIPrefix    = "cgledger.v1"
	APICardPut   = APIPrefix + ".card.put"
	APICardGet   = APIPrefix + ".card.get"
	APIDispatch  = APIPrefix + ".dispatch"
	APIReport    = APIPrefix + ".report"
	APIRosterSet = APIPrefix + ".roster.set"
	APIRosterGet = APIPrefix + ".roster.get"
	APICallGet   = APIPrefix + ".call.get"
	APIConsume   = APIPrefix + ".inbox.consume"
	APIToolReg   = APIPrefix + ".tool.register"
	APIToolGet   = APIPrefix + ".tool.get"
	APIToolList  = APIPrefix + ".tool.list"
	APICancel    = APIPrefix + ".cancel"
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

// APIReply is the body of every API reply: Result on success, Error otherwise.
type APIReply struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
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

type apiHandler func(ctx context.Context, m *nats.Msg) (any, error)

// ServeAPI subscribes the API subjects (in a queue group) and serves them
// with this ledger. ctx bounds the server's life as Stop does.
func (l *Ledger) ServeAPI(ctx context.Context, cfg APIConfig) (*APIServer, error) {
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
		APICardPut:   func(ctx context.Context, m *nats.Msg) (any, error) { return l.PutCardJSON(ctx, m.Data) },
		APICardGet:   s.cardGet,
		APIDispatch:  func(ctx context.Context, m *nats.Msg) (any, error) { return l.DispatchMsg(ctx, m.Header, m.Data) },
		APIReport:    func(ctx context.Context, m *nats.Msg) (any, error) { return l.ReportMsg(ctx, m.Header, m.Data) },
		APIRosterSet: func(ctx context.Context, m *nats.Msg) (any, error) { return l.SetRosterJSON(ctx, m.Data) },
		APIRosterGet: s.rosterGet,
		APICallGet:   s.callGet,
		APIConsume:   func(ctx context.Context, m *nats.Msg) (any, error) { return l.ConsumeJSON(ctx, m.Data) },
		APIToolReg: func(ctx context.Context, m *nats.Msg) (any, error) {
			return l.RegisterToolYAML(ctx, HeaderGet(m.Header, HeaderProjectID), m.Data)
		},
		APICancel:   func(ctx context.Context, m *nats.Msg) (any, error) { return l.CancelJSON(ctx, m.Data) },
		APIToolGet:  s.toolGet,
		APIToolList: s.toolList,
	}
	for subj, h := range handlers {
		sub, err := l.nc.QueueSubscribe(subj, cfg.QueueGroup, s.handle(h))
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

func (s *APIServer) handle(h apiHandler) nats.MsgHandler {
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
			ctx, cancel := context.WithTimeout(s.ctx, s.cfg.RequestTimeout)
			defer cancel()
			res, err := h(ctx, m)
			if m.Reply == "" {
				return
			}
			if rerr := m.Respond(encodeReply(res, err)); rerr != nil {
				s.l.log.Warn("api reply not sent", "subject", m.Subject, "err", rerr)
			}
		}()
	}
}

// encodeReply builds the reply body. Errors that are not protocol refusals
// become code "internal": nothing was rejected, the client may retry.
func encodeReply(res any, err error) []byte {
	var r APIReply
	if err != nil {
		e, ok := AsError(err)
		if !ok {
			e = &Error{Code: CodeInternal, Message: err.Error()}
		}
		r.Error = e
	} else {
		b, merr := json.Marshal(res)
		if merr != nil {
			r.Error = &Error{Code: CodeInternal, Message: "encode result: " + merr.Error()}
		} else {
			r.OK, r.Result = true, b
		}
	}
	b, _ := json.Marshal(r)
	return b
}

func (s *APIServer) cardGet(ctx context.Context, m *nats.Msg) (any, error) {
	var vs Violations
	o, ok := parseObject("body", m.Data, &vs)
	var ids []string
	project := ""
	if ok {
		project = o.ident("project_id", true)
		if r := o.raw("card_ids"); r == nil {
			vs.Add("body.card_ids", VRequired, "is required")
		} else if err := json.Unmarshal(r, &ids); err != nil {
			vs.Add("body.card_ids", VInvalidType, "must be an array of strings")
		}
		for i, id := range ids {
			checkIdent(&vs, fmt.Sprintf("body.card_ids[%d]", i), id, true)
		}
		if r := o.raw("card_ids"); r != nil && len(ids) == 0 && len(vs) == 0 {
			vs.Add("body.card_ids", VEmpty, "at least one card id is required")
		}
		if len(ids) > maxCardIDs {
			vs.Add("body.card_ids", VTooLarge, "at most %d card ids per request, got %d", maxCardIDs, len(ids))
		}
	}
	if err := badRequest("card.get request", vs); err != nil {
		return nil, err
	}
	cards, missing, err := s.l.GetCards(ctx, project, ids)
	if err != nil {
		return nil, err
	}
	if cards == nil {
		cards = []StoredCard{}
	}
	if missing == nil {
		missing = []string{}
	}
	return struct {
		Cards   []StoredCard `json:"cards"`
		Missing []string     `json:"missing"`
	}{cards, missing}, nil
}

func (s *APIServer) rosterGet(ctx context.Context, m *nats.Msg) (any, error) {
	var vs Violations
	o, ok := parseObject("body", m.Data, &vs)
	var project, agent string
	if ok {
		project, agent = o.ident("project_id", true), o.ident("agent_id", true)
	}
	if err := badRequest("roster.get request", vs); err != nil {
		return nil, err
	}
	return s.l.GetRoster(ctx, project, agent)
}

func (s *APIServer) callGet(ctx context.Context, m *nats.Msg) (any, error) {
	var vs Violations
	o, ok := parseObject("body", m.Data, &vs)
	var project, turn, call string
	if ok {
		project, turn, call = o.ident("project_id", true), o.ident("agent_turn_id", true), o.ident("tool_call_id", true)
	}
	if err := badRequest("call.get request", vs); err != nil {
		return nil, err
	}
	return s.l.GetCall(ctx, project, turn, call)
}

func (s *APIServer) toolGet(ctx context.Context, m *nats.Msg) (any, error) {
	var vs Violations
	o, ok := parseObject("body", m.Data, &vs)
	var project, tool string
	if ok {
		project, tool = o.ident("project_id", true), o.ident("tool_name", true)
	}
	if err := badRequest("tool.get request", vs); err != nil {
		return nil, err
	}
	return s.l.GetTool(ctx, project, tool)
}

func (s *APIServer) toolList(ctx context.Context, m *nats.Msg) (any, error) {
	var vs Violations
	o, ok := parseObject("body", m.Data, &vs)
	var project string
	if ok {
		project = o.ident("project_id", true)
	}
	if err := badRequest("tool.list request", vs); err != nil {
		return nil, err
	}
	tools, err := s.l.ListTools(ctx, project)
	return struct {
		Tools []StoredTool `json:"tools"`
	}{tools}, err
}
