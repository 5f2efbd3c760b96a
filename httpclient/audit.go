package httpclient

import (
	"context"
	"net/url"
	"strconv"
	"time"

	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// Projects lists the projects the views hold (GET /v1/projects).
func (c *Client) Projects(ctx context.Context, l List) (projector.Page[projector.ProjectInfo], error) {
	return get[projector.Page[projector.ProjectInfo]](ctx, c, "/v1/projects", listQuery(l))
}

// Timeline is every entry of a turn in ledger order
// (GET /v1/projects/{project}/turns/{turn}/timeline).
func (c *Client) Timeline(ctx context.Context, project, turn string, at AsOf) (projector.Timeline, error) {
	return get[projector.Timeline](ctx, c, "/v1/projects"+path(project, "turns", turn, "timeline"), asOfQuery(at))
}

// TurnCards lists every version of every card of a turn
// (GET /v1/projects/{project}/turns/{turn}/cards).
func (c *Client) TurnCards(ctx context.Context, project, turn string, l List) (projector.Page[projector.CardVersion], error) {
	return get[projector.Page[projector.CardVersion]](ctx, c, "/v1/projects"+path(project, "turns", turn, "cards"), listQuery(l))
}

// CallState is the state of one call
// (GET /v1/projects/{project}/turns/{turn}/calls/{call}).
func (c *Client) CallState(ctx context.Context, project, turn, call string, at AsOf) (projector.CallStateAnswer, error) {
	return get[projector.CallStateAnswer](ctx, c, "/v1/projects"+path(project, "turns", turn, "calls", call), asOfQuery(at))
}

// CallStory is the state of every call using the tool_call_id and every
// entry (GET /v1/projects/{project}/calls/{call}); a turn other than ""
// keeps only that turn's call.
func (c *Client) CallStory(ctx context.Context, project, call, turn string, at AsOf) (projector.CallStory, error) {
	q := asOfQuery(at)
	if turn != "" {
		q.Set("turn", turn)
	}
	return get[projector.CallStory](ctx, c, "/v1/projects"+path(project, "calls", call), q)
}

// CallFilter selects calls of a project's listing; zero fields select all.
type CallFilter struct {
	Tool, Agent, Channel string
	// Status is a result status (success, failed, canceled, timeout,
	// partial); State a lifecycle state (awaiting_approval, paused,
	// dispatched, reported, consumed, rejected).
	Status, State string
	// From and To bound the dispatch time (inclusive).
	From, To time.Time
}

// Calls lists a project's calls by dispatch time, filtered
// (GET /v1/projects/{project}/calls). A page can hold fewer than the limit
// (even none) with a next cursor: page until NextCursor is empty.
func (c *Client) Calls(ctx context.Context, project string, f CallFilter, l List) (projector.Page[projector.CallState], error) {
	q := listQuery(l)
	for k, v := range map[string]string{"tool": f.Tool, "agent": f.Agent, "channel": f.Channel, "status": f.Status, "state": f.State} {
		if v != "" {
			q.Set(k, v)
		}
	}
	setTime(q, "from", f.From)
	setTime(q, "to", f.To)
	return get[projector.Page[projector.CallState]](ctx, c, "/v1/projects"+path(project, "calls"), q)
}

// OverviewRange is the span an overview counts (zero: from the first call,
// up to now) and its number of time buckets (0: the server's 48).
type OverviewRange struct {
	From, To time.Time
	Buckets  int
}

// Overview counts a project's calls per status and tool in time buckets
// (GET /v1/projects/{project}/overview).
func (c *Client) Overview(ctx context.Context, project string, r OverviewRange, at AsOf) (projector.Overview, error) {
	q := asOfQuery(at)
	setTime(q, "from", r.From)
	setTime(q, "to", r.To)
	if r.Buckets > 0 {
		q.Set("buckets", strconv.Itoa(r.Buckets))
	}
	return get[projector.Overview](ctx, c, "/v1/projects"+path(project, "overview"), q)
}

// Inbox lists an agent's reported results in arrival order
// (GET /v1/projects/{project}/agents/{agent}/inbox); state is pending,
// consumed, all or "" (all).
func (c *Client) Inbox(ctx context.Context, project, agent, state string, l List) (projector.Page[projector.InboxEntry], error) {
	q := listQuery(l)
	if state != "" {
		q.Set("state", state)
	}
	return get[projector.Page[projector.InboxEntry]](ctx, c, "/v1/projects"+path(project, "agents", agent, "inbox"), q)
}

// Roster is an agent's worker target
// (GET /v1/projects/{project}/agents/{agent}/roster).
func (c *Client) Roster(ctx context.Context, project, agent string, at AsOf) (projector.RosterAnswer, error) {
	return get[projector.RosterAnswer](ctx, c, "/v1/projects"+path(project, "agents", agent, "roster"), asOfQuery(at))
}

// Card is a card's latest version and every version up to it
// (GET /v1/projects/{project}/cards/{card}).
func (c *Client) Card(ctx context.Context, project, card string, at AsOf) (projector.CardResult, error) {
	return get[projector.CardResult](ctx, c, "/v1/projects"+path(project, "cards", card), asOfQuery(at))
}

// ProjectTools lists the tools registered in a project at their versions
// in force, from the views (GET /v1/projects/{project}/tools).
func (c *Client) ProjectTools(ctx context.Context, project string, l List) (projector.Page[projector.ToolVersion], error) {
	return get[projector.Page[projector.ToolVersion]](ctx, c, "/v1/projects"+path(project, "tools"), listQuery(l))
}

// ProjectTool is a tool's registration history, from the views
// (GET /v1/projects/{project}/tools/{tool}).
func (c *Client) ProjectTool(ctx context.Context, project, tool string, at AsOf) (projector.ToolHistory, error) {
	return get[projector.ToolHistory](ctx, c, "/v1/projects"+path(project, "tools", tool), asOfQuery(at))
}

// Unrecognized lists the stream messages that are not ledger entries
// (GET /v1/unrecognized).
func (c *Client) Unrecognized(ctx context.Context, l List) (projector.Page[projector.UnrecognizedEntry], error) {
	return get[projector.Page[projector.UnrecognizedEntry]](ctx, c, "/v1/unrecognized", listQuery(l))
}

// Skipped lists the entries a skip entry named (GET /v1/skipped).
func (c *Client) Skipped(ctx context.Context, l List) (projector.Page[projector.SkippedEntry], error) {
	return get[projector.Page[projector.SkippedEntry]](ctx, c, "/v1/skipped", listQuery(l))
}

// Skips lists the valid skip entries (GET /v1/skips).
func (c *Client) Skips(ctx context.Context, l List) (projector.Page[projector.SkipItem], error) {
	return get[projector.Page[projector.SkipItem]](ctx, c, "/v1/skips", listQuery(l))
}

// Digest is the digest of every view row with its applied sequence and
// chain head (GET /v1/digest).
func (c *Client) Digest(ctx context.Context) (projector.DigestResult, error) {
	return get[projector.DigestResult](ctx, c, "/v1/digest", nil)
}

// ChainLink is the link the views recorded after applying seq
// (GET /v1/chain/{seq}).
func (c *Client) ChainLink(ctx context.Context, seq uint64) (projector.ChainLink, error) {
	return get[projector.ChainLink](ctx, c, "/v1/chain/"+strconv.FormatUint(seq, 10), nil)
}

// Verify recomputes the live stream's hash chain on the server and
// compares it with the views' (GET /v1/verify).
func (c *Client) Verify(ctx context.Context) (stream.VerifyReport, error) {
	return get[stream.VerifyReport](ctx, c, "/v1/verify", nil)
}

// Approvals lists a project's calls held for approval, oldest first
// (GET /v1/projects/{project}/approvals); state is pending (also ""),
// decided or all.
func (c *Client) Approvals(ctx context.Context, project, state string, l List) (projector.Page[protocol.ApprovalItem], error) {
	q := listQuery(l)
	if state != "" {
		q.Set("state", state)
	}
	return get[projector.Page[protocol.ApprovalItem]](ctx, c, "/v1/projects"+path(project, "approvals"), q)
}

// Approval is one held call (GET /v1/projects/{project}/approvals/{turn}/{call}).
func (c *Client) Approval(ctx context.Context, project, turn, call string, at AsOf) (projector.ApprovalAnswer, error) {
	return get[projector.ApprovalAnswer](ctx, c, "/v1/projects"+path(project, "approvals", turn, call), asOfQuery(at))
}

// Decision is the body of an approve or deny: the call's tool.call card
// and the digest of its arguments (from Approval), and why.
type Decision struct {
	ToolCallCardID  string `json:"tool_call_card_id"`
	ArgumentsDigest string `json:"arguments_digest"`
	Reason          string `json:"reason"`
	// Approver names who decides when not the credential's label.
	Approver string `json:"approver,omitempty"`
}

// Approve approves a held call as the bearer's approver
// (POST .../approvals/{turn}/{call}/approve).
func (c *Client) Approve(ctx context.Context, project, turn, call string, d Decision) (protocol.ApprovalResult, error) {
	return post[protocol.ApprovalResult](ctx, c, "/v1/projects"+path(project, "approvals", turn, call, "approve"), d)
}

// Deny denies a held call as the bearer's approver
// (POST .../approvals/{turn}/{call}/deny).
func (c *Client) Deny(ctx context.Context, project, turn, call string, d Decision) (protocol.ApprovalResult, error) {
	return post[protocol.ApprovalResult](ctx, c, "/v1/projects"+path(project, "approvals", turn, call, "deny"), d)
}

// Operator is the body of an operator action on a call: why, the effect
// of a resolve (protocol.EffectApplied or EffectNotApplied), and an actor
// naming who acts when not the credential's label.
type Operator struct {
	Reason string `json:"reason"`
	Effect string `json:"effect,omitempty"`
	Actor  string `json:"actor,omitempty"`
}

// CancelCall cancels any agent's call as an operator
// (POST /v1/projects/{project}/turns/{turn}/calls/{call}/cancel).
func (c *Client) CancelCall(ctx context.Context, project, turn, call string, o Operator) (protocol.OperatorCancelResult, error) {
	return post[protocol.OperatorCancelResult](ctx, c, callPath(project, turn, call, "cancel"), o)
}

// ResolveCall records whether an outcome_unknown call's side effect took
// place (POST .../calls/{call}/resolve; o.Effect is required).
func (c *Client) ResolveCall(ctx context.Context, project, turn, call string, o Operator) (protocol.ResolveResult, error) {
	return post[protocol.ResolveResult](ctx, c, callPath(project, turn, call, "resolve"), o)
}

// RedriveCall redrives a failed or timed-out call as a derived call
// (POST .../calls/{call}/redrive).
func (c *Client) RedriveCall(ctx context.Context, project, turn, call string, o Operator) (protocol.RedriveResult, error) {
	return post[protocol.RedriveResult](ctx, c, callPath(project, turn, call, "redrive"), o)
}

func callPath(project, turn, call, action string) string {
	return "/v1/projects" + path(project, "turns", turn, "calls", call, action)
}

func asOfQuery(at AsOf) url.Values {
	q := url.Values{}
	at.set(q)
	return q
}

func listQuery(l List) url.Values {
	q := url.Values{}
	l.set(q)
	return q
}

func setTime(q url.Values, name string, t time.Time) {
	if !t.IsZero() {
		q.Set(name, t.Format(time.RFC3339Nano))
	}
}
