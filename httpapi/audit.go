package httpapi

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/cgledger/cgledger/docs"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// AuditConfig wires the audit HTTP API.
type AuditConfig struct {
	// Verify, when set, serves GET /v1/verify (chain check against the live
	// stream).
	Verify func(ctx context.Context) (stream.VerifyReport, error)
	// Decide, when set, serves POST /v1/projects/{project}/approvals/{turn}/{call}/approve
	// and .../deny (docs/approvals.md): serve sets it where the process
	// reaches the ledger API.
	Decide DecideFunc
	// Approver names the approver a POST approve or deny acts as: serve
	// returns the bearer credential's approver name (ok true, the name
	// empty when the credential has none, which is refused). Nil, or ok
	// false (serve without credentials), takes the body's "approver".
	Approver func(r *http.Request) (name string, ok bool)
	// Operate, when set, serves POST /v1/projects/{project}/turns/{turn}/calls/{call}/cancel
	// and .../resolve (docs/operations.md, "Operator actions"): serve sets
	// it where the process reaches the ledger API.
	Operate OperateFunc
	// Operator names the actor an operator action is recorded under: serve
	// returns the bearer admin credential's (ok true). Nil, or ok false
	// (serve without credentials), takes the body's "actor".
	Operator func(r *http.Request) (actor string, ok bool)
}

// Audit serves the audit API under /v1/ (docs/audit-api.md). Answers are
// JSON; errors are RFC 9457 problem details. A request
// no route serves is 404, or 405 with Allow when the path is served (here or,
// per the OpenAPI document, next to this handler: /v1/export) for other
// methods.
func Audit(q *projector.Queries, cfg AuditConfig) http.Handler {
	mux := http.NewServeMux()
	h := &handler{q: q, cfg: cfg}
	for _, rt := range h.routes() {
		mux.HandleFunc(rt.pattern, SingleValued(rt.serve))
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		noRouteDocumented(w, r, append(AllowedMethods(mux, r, "/v1/"), docs.Methods(r.URL.EscapedPath())...))
	})
	return mux
}

// AuditRoutes are the patterns Audit serves (its catch-all aside); the
// OpenAPI document's tests check each is documented.
func AuditRoutes() []string {
	var out []string
	for _, rt := range (&handler{}).routes() {
		out = append(out, rt.pattern)
	}
	return out
}

type route struct {
	pattern string
	serve   http.HandlerFunc
}

func (h *handler) routes() []route {
	return []route{
		{"GET /v1/projects", listing(h.projects, projector.ProjectsCursor())},
		{"GET /v1/projects/{project}/turns/{turn}/timeline", h.timeline},
		{"GET /v1/projects/{project}/turns/{turn}/cards", h.turnCards},
		{"GET /v1/projects/{project}/turns/{turn}/calls/{call}", h.callState},
		{"GET /v1/projects/{project}/calls", h.calls},
		{"GET /v1/projects/{project}/calls/{call}", h.callStory},
		{"GET /v1/projects/{project}/overview", h.overview},
		{"GET /v1/projects/{project}/agents/{agent}/inbox", h.inbox},
		{"GET /v1/projects/{project}/agents/{agent}/roster", h.roster},
		{"GET /v1/projects/{project}/cards/{card}", h.card},
		{"GET /v1/projects/{project}/tools", h.tools},
		{"GET /v1/projects/{project}/tools/{tool}", h.tool},
		{"GET /v1/projects/{project}/approvals", h.approvals},
		{"GET /v1/projects/{project}/approvals/{turn}/{call}", h.approval},
		{"POST /v1/projects/{project}/approvals/{turn}/{call}/approve", h.decide(protocol.OpApprove)},
		{"POST /v1/projects/{project}/approvals/{turn}/{call}/deny", h.decide(protocol.OpDeny)},
		{"POST /v1/projects/{project}/turns/{turn}/calls/{call}/cancel", h.operate(protocol.OpCallCancel)},
		{"POST /v1/projects/{project}/turns/{turn}/calls/{call}/resolve", h.operate(protocol.OpCallResolve)},
		{"POST /v1/projects/{project}/turns/{turn}/calls/{call}/redrive", h.operate(protocol.OpCallRedrive)},
		{"GET /v1/unrecognized", listing(h.unrecognized, projector.UnrecognizedCursor())},
		{"GET /v1/skipped", listing(h.skipped, projector.SkippedCursor())},
		{"GET /v1/skips", listing(h.skips, projector.SkipsCursor())},
		{"GET /v1/digest", h.digest},
		{"GET /v1/verify", h.verify},
		{"GET /v1/chain/{seq}", h.chainLink},
		{"GET " + docs.OpenAPIPath, serveOpenAPI},
	}
}

// The global listings, bound late: Routes lists patterns without a store.
func (h *handler) projects(at projector.AsOf, cursor string, limit int) (*projector.Page[projector.ProjectInfo], error) {
	return h.q.Projects(at, cursor, limit)
}

func (h *handler) unrecognized(at projector.AsOf, cursor string, limit int) (*projector.Page[projector.UnrecognizedEntry], error) {
	return h.q.Unrecognized(at, cursor, limit)
}

func (h *handler) skipped(at projector.AsOf, cursor string, limit int) (*projector.Page[projector.SkippedEntry], error) {
	return h.q.Skipped(at, cursor, limit)
}

func (h *handler) skips(at projector.AsOf, cursor string, limit int) (*projector.Page[projector.SkipItem], error) {
	return h.q.Skips(at, cursor, limit)
}

type handler struct {
	q   *projector.Queries
	cfg AuditConfig
}

// params parses the query string (and the path's ids), collecting every
// violation, so that a 400 names every parameter problem at once; the
// queries check them again for their other callers.
type params struct {
	r  *http.Request
	vs protocol.Violations
}

func (p *params) str(name string) string { return p.r.URL.Query().Get(name) }

func (p *params) uint(name string) uint64 {
	s := p.str(name)
	if s == "" {
		return 0
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		p.vs.Add(name, protocol.VInvalidValue, "must be an unsigned integer, got %q", s)
	}
	return n
}

func (p *params) time(name string) time.Time {
	s := p.str(name)
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		p.vs.Add(name, protocol.VInvalidValue, "must be an RFC 3339 time such as 2026-11-22T10:00:00Z, got %q", s)
		return t
	}
	// Views index time in int64 nanoseconds since 1970: outside that range
	// a time cannot be compared, so it is refused rather than misread.
	if t.Before(minIndexTime) || t.After(maxIndexTime) {
		p.vs.Add(name, protocol.VInvalidValue, "must be between %s and %s, got %q", minIndexTime.Format(time.RFC3339), maxIndexTime.Format(time.RFC3339), s)
	}
	return t
}

// The times the views' indexes can hold (int64 nanoseconds, and not before
// the epoch, which the index does not order).
var (
	minIndexTime = time.Unix(0, 0).UTC()
	maxIndexTime = time.Unix(0, math.MaxInt64).UTC().Truncate(time.Second)
)

func (p *params) asOf() projector.AsOf {
	seq := p.uint("as_of_seq")
	if seq == 0 && p.r.URL.Query().Has("as_of_seq") && p.str("as_of_seq") != "" {
		if _, err := strconv.ParseUint(p.str("as_of_seq"), 10, 64); err == nil {
			p.vs.Add("as_of_seq", protocol.VInvalidValue, "must be a ledger sequence, 1 or more (leave it out for the latest)")
		}
	}
	return projector.AsOf{Seq: seq, Time: p.time("as_of")}
}

// ids lists the path's ids (field, value pairs) that are not identifiers.
func (p *params) ids(pairs ...string) { p.vs = append(p.vs, projector.IDViolations(pairs...)...) }

// cursor returns the cursor parameter, listing one that is not a cursor of
// the query belongs checks. belongs is nil when the query is unknown (a
// parameter it depends on is wrong): then only a string that is no cursor
// of any list is listed.
func (p *params) cursor(belongs projector.CursorCheck) string {
	c := p.str("cursor")
	if c == "" {
		return c
	}
	if !projector.IsCursor(c) || belongs != nil && belongs(c) != nil {
		p.vs.Add("cursor", protocol.VInvalidValue, "is not a cursor of this query")
	}
	return c
}

func (p *params) limit() int { return Limit(p.r, &p.vs) }

// done writes a 400 with every violation when there are any.
func (p *params) done(w http.ResponseWriter) bool {
	if len(p.vs) == 0 {
		return false
	}
	Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid query parameters", Violations: p.vs})
	return true
}

// asOfOnly parses the as-of parameters of an endpoint that takes nothing
// else; ok=false means a 400 was written.
func asOfOnly(w http.ResponseWriter, r *http.Request) (projector.AsOf, bool) {
	p := &params{r: r}
	at := p.asOf()
	return at, !p.done(w)
}

func reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		Error(w, err)
		return
	}
	Write(w, http.StatusOK, v)
}

func (h *handler) timeline(w http.ResponseWriter, r *http.Request) {
	at, ok := asOfOnly(w, r)
	if !ok {
		return
	}
	res, err := h.q.Timeline(r.PathValue("project"), r.PathValue("turn"), at)
	reply(w, res, err)
}

func (h *handler) turnCards(w http.ResponseWriter, r *http.Request) {
	project, turn := r.PathValue("project"), r.PathValue("turn")
	at, cursor, limit, ok := pageParams(w, r, projector.TurnCardsCursor(project, turn), "project_id", project, "agent_turn_id", turn)
	if !ok {
		return
	}
	res, err := h.q.TurnCardsPage(project, turn, at, cursor, limit)
	reply(w, res, err)
}

func (h *handler) callState(w http.ResponseWriter, r *http.Request) {
	at, ok := asOfOnly(w, r)
	if !ok {
		return
	}
	st, seq, err := h.q.CallState(r.PathValue("project"), r.PathValue("turn"), r.PathValue("call"), at)
	reply(w, projector.CallStateAnswer{AsOfSeq: seq, Call: st}, err)
}

func (h *handler) callStory(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	at := p.asOf()
	turn := p.str("turn")
	if p.done(w) {
		return
	}
	res, err := h.q.CallStory(r.PathValue("project"), r.PathValue("call"), turn, at)
	reply(w, res, err)
}

func (h *handler) calls(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	project := r.PathValue("project")
	p.ids("project_id", project)
	at := p.asOf()
	f := projector.CallFilter{Tool: p.str("tool"), Status: p.str("status"), State: p.str("state"), Agent: p.str("agent"),
		Channel: p.str("channel"), From: p.time("from"), To: p.time("to")}
	limit := p.limit()
	fvs := f.Violations()
	var belongs projector.CursorCheck
	if len(fvs) == 0 {
		belongs = projector.CallsCursor(project, f)
	}
	cursor := p.cursor(belongs)
	p.vs = append(p.vs, fvs...)
	if p.done(w) {
		return
	}
	res, err := h.q.Calls(project, f, at, cursor, limit)
	reply(w, res, err)
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	project := r.PathValue("project")
	p.ids("project_id", project)
	at := p.asOf()
	oq := projector.OverviewQuery{From: p.time("from"), To: p.time("to")}
	if s := p.str("buckets"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			// Listed once: the range check below would name it again.
			p.vs.Add("buckets", protocol.VInvalidValue, "must be an integer between 1 and %d, got %q", projector.MaxOverviewBuckets, s)
		}
		oq.Buckets = n
	}
	p.vs = append(p.vs, oq.Violations()...)
	if p.done(w) {
		return
	}
	res, err := h.q.Overview(project, oq, at)
	reply(w, res, err)
}

func (h *handler) inbox(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	project, agent, st := r.PathValue("project"), r.PathValue("agent"), p.str("state")
	p.ids("project_id", project, "agent_id", agent)
	at := p.asOf()
	limit := p.limit()
	belongs := projector.InboxCursor(project, agent, st)
	switch st {
	case "", "all", projector.InboxPending, projector.InboxConsumed:
	default:
		p.vs.Add("state", protocol.VInvalidValue, "must be pending, consumed or all, got %q", st)
		belongs = nil
	}
	cursor := p.cursor(belongs)
	if p.done(w) {
		return
	}
	res, err := h.q.Inbox(project, agent, st, at, cursor, limit)
	reply(w, res, err)
}

func (h *handler) roster(w http.ResponseWriter, r *http.Request) {
	at, ok := asOfOnly(w, r)
	if !ok {
		return
	}
	res, seq, err := h.q.Roster(r.PathValue("project"), r.PathValue("agent"), at)
	reply(w, projector.RosterAnswer{AsOfSeq: seq, RosterResult: res}, err)
}

func (h *handler) card(w http.ResponseWriter, r *http.Request) {
	at, ok := asOfOnly(w, r)
	if !ok {
		return
	}
	res, err := h.q.Card(r.PathValue("project"), r.PathValue("card"), at)
	reply(w, res, err)
}

func (h *handler) tools(w http.ResponseWriter, r *http.Request) {
	project := r.PathValue("project")
	at, cursor, limit, ok := pageParams(w, r, projector.ToolsCursor(project), "project_id", project)
	if !ok {
		return
	}
	res, err := h.q.ToolsPage(project, at, cursor, limit)
	reply(w, res, err)
}

func (h *handler) tool(w http.ResponseWriter, r *http.Request) {
	at, ok := asOfOnly(w, r)
	if !ok {
		return
	}
	res, err := h.q.Tool(r.PathValue("project"), r.PathValue("tool"), at)
	reply(w, res, err)
}

// pageParams parses the path's ids (field, value pairs), as-of, cursor
// (of the list belongs checks) and limit, the parameters of a list without
// filters; ok=false means a 400 was written.
func pageParams(w http.ResponseWriter, r *http.Request, belongs projector.CursorCheck, ids ...string) (at projector.AsOf, cursor string, limit int, ok bool) {
	p := &params{r: r}
	p.ids(ids...)
	at, cursor, limit = p.asOf(), p.cursor(belongs), p.limit()
	return at, cursor, limit, !p.done(w)
}

// listing serves one of the global paged listings (as-of, cursor, limit).
func listing[T any](list func(at projector.AsOf, cursor string, limit int) (*projector.Page[T], error), belongs projector.CursorCheck) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		at, cursor, limit, ok := pageParams(w, r, belongs)
		if !ok {
			return
		}
		res, err := list(at, cursor, limit)
		reply(w, res, err)
	}
}

func (h *handler) digest(w http.ResponseWriter, r *http.Request) {
	res, err := h.q.Digest()
	reply(w, res, err)
}

// chainLink answers the live chain's link at one sequence, so that an
// export can be compared with the ledger it claims to come from.
func (h *handler) chainLink(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		var vs protocol.Violations
		vs.Add("seq", protocol.VInvalidValue, "must be a ledger sequence (a positive integer), got %q", r.PathValue("seq"))
		Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid sequence", Violations: vs})
		return
	}
	res, err := h.q.ChainLinkAt(seq)
	reply(w, res, err)
}

func (h *handler) verify(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Verify == nil {
		Error(w, &protocol.Error{Code: protocol.CodeNotFound, Message: "verification against the live stream is not configured here"})
		return
	}
	rep, err := h.cfg.Verify(r.Context())
	if err != nil && !errors.Is(err, context.Canceled) {
		Error(w, err)
		return
	}
	reply(w, rep, err)
}
