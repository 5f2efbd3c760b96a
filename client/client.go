// Package client calls a ledger's request/reply API over NATS
// (docs/protocol.md): what a worker, a tool service or an executor in another
// process uses instead of the in-process ledger.Ledger. Its operations have
// the same names and signatures as the ledger's.
package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/protocol"
)

// Client calls a ledger's request/reply API over NATS. Refusals come back as
// *protocol.Error with the server's code and violations, so errors.Is works as
// with a local ledger.Ledger.
//
// Each request goes to cgledger.v1.<project>.<actor>.<op>. Where the ledger
// checks the actor against an agent (dispatch, roster.set, inbox.consume,
// inbox.list, cancel) the client takes it from the request; a report goes out as its
// source function when that is an identifier, or as the WithActor actor
// when one is set (the ledger wants the call's tool target: set WithActor
// when they differ); tool.consumer as the tool
// asked for; report.resume and command.reject as the tool the call's command
// subject targets; elsewhere the client's actor.
type Client struct {
	nc    *nats.Conn
	actor string
	// actorSet says WithActor chose the actor, which then also names
	// reports (their source function is only a default).
	actorSet bool
	timeout  time.Duration
}

// DefaultActor is the actor token of a client that was given none.
const DefaultActor = "client"

// Option adjusts a Client.
type Option func(*Client)

// WithActor sets the actor token for requests whose actor the ledger does not
// derive from the request: a worker credential bound to one agent must use
// that agent id, a tool credential its tool. A set actor also names the
// client's reports, whose default is their source function.
func WithActor(actor string) Option {
	return func(c *Client) { c.actor, c.actorSet = actor, true }
}

// DefaultTimeout bounds a request whose context has no deadline.
const DefaultTimeout = 30 * time.Second

// WithTimeout sets how long a request whose context has no deadline waits
// for its answer (DefaultTimeout when not set). A request NATS refuses on
// permissions is never answered: it ends at this deadline, and nats.go's
// async error handler (nats.ErrorHandler) names the violation.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// New returns a client using nc.
func New(nc *nats.Conn, opts ...Option) *Client {
	c := &Client{nc: nc, actor: DefaultActor, timeout: DefaultTimeout}
	for _, o := range opts {
		o(c)
	}
	return c
}

// subject builds an API subject; an empty actor means the client's own.
func (c *Client) subject(project, actor, op string) string {
	if actor == "" {
		actor = c.actor
	}
	// An empty token would make an invalid subject no server answers; "_"
	// reaches the ledger, which lists the missing id as a violation.
	if project == "" {
		project = "_"
	}
	return protocol.APISubject(project, actor, op)
}

func (c *Client) call(ctx context.Context, msg *nats.Msg, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		// A request NATS refuses (a permissions violation) gets no reply
		// at all: without a deadline it would wait for ever.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	resp, err := c.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return fmt.Errorf("ledger client: %s: %w", msg.Subject, err)
	}
	var r protocol.APIReply
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return fmt.Errorf("ledger client: %s: decode reply: %w", msg.Subject, err)
	}
	if !r.OK {
		if r.Error == nil {
			return fmt.Errorf("ledger client: %s: reply has neither result nor error", msg.Subject)
		}
		return r.Error
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(r.Result, out); err != nil {
		return fmt.Errorf("ledger client: %s: decode result: %w", msg.Subject, err)
	}
	return nil
}

func jsonMsg(subject string, v any) (*nats.Msg, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("ledger client: encode %s request: %w", subject, err)
	}
	return &nats.Msg{Subject: subject, Data: b, Header: nats.Header{}}, nil
}

// PutCard stores a card (see Ledger.PutCard).
func (c *Client) PutCard(ctx context.Context, card protocol.Card) (protocol.PutCardResult, error) {
	var out protocol.PutCardResult
	msg, err := jsonMsg(c.subject(card.ProjectID, "", protocol.OpCardPut), card)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// GetCards reads cards by id (see Ledger.GetCards).
func (c *Client) GetCards(ctx context.Context, project string, ids []string) ([]protocol.StoredCard, []string, error) {
	var out struct {
		Cards   []protocol.StoredCard `json:"cards"`
		Missing []string              `json:"missing"`
	}
	msg, err := jsonMsg(c.subject(project, "", protocol.OpCardGet), map[string]any{"project_id": project, "card_ids": ids})
	if err != nil {
		return nil, nil, err
	}
	if err := c.call(ctx, msg, &out); err != nil {
		return nil, nil, err
	}
	return out.Cards, out.Missing, nil
}

// Dispatch writes the tool.call card and publishes the command (see Ledger.Dispatch).
func (c *Client) Dispatch(ctx context.Context, req protocol.DispatchRequest) (protocol.DispatchResult, error) {
	var out protocol.DispatchResult
	card, err := json.Marshal(req.Card)
	if err != nil {
		return out, fmt.Errorf("ledger client: encode card: %w", err)
	}
	payload, err := json.Marshal(req.Payload)
	if err != nil {
		return out, fmt.Errorf("ledger client: encode payload: %w", err)
	}
	msg, err := jsonMsg(c.subject(protocol.SubjectProject(req.Subject), req.Identity.AgentID, protocol.OpDispatch), protocol.DispatchBody{Subject: req.Subject, Card: card, Payload: payload, Approval: req.Approval, Checks: req.Checks})
	if err != nil {
		return out, err
	}
	req.Identity.Apply(msg.Header)
	return out, c.call(ctx, msg, &out)
}

// Report submits a tool result report (see Ledger.Report).
func (c *Client) Report(ctx context.Context, req protocol.ReportRequest) (protocol.ReportOutcome, error) {
	var out protocol.ReportOutcome
	msg, err := c.reportMsg(protocol.OpReport, req, req.Payload)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// reportMsg is a report's request for op (report or report.result): body
// on the subject of the reporting tool, with the report's headers.
func (c *Client) reportMsg(op string, req protocol.ReportRequest, body any) (*nats.Msg, error) {
	actor := identOr(req.SourceFunction)
	if c.actorSet {
		actor = c.actor
	}
	msg, err := jsonMsg(c.subject(req.ProjectID, actor, op), body)
	if err != nil {
		return nil, err
	}
	req.Identity.Apply(msg.Header)
	msg.Header.Set(protocol.HeaderProjectID, req.ProjectID)
	msg.Header.Set(protocol.HeaderChannelID, req.ChannelID)
	msg.Header.Set(protocol.HeaderSourceID, req.SourceID)
	msg.Header.Set(protocol.HeaderSourceFunction, req.SourceFunction)
	return msg, nil
}

// ReportResult stores a call's tool.result card and its report in one
// request (see Ledger.ReportResult): the report.result operation.
func (c *Client) ReportResult(ctx context.Context, card protocol.Card, req protocol.ReportRequest) (protocol.ReportResultOutcome, error) {
	var out protocol.ReportResultOutcome
	msg, err := c.reportMsg(protocol.OpReportResult, req, protocol.ReportResultBody{Card: card, Report: req.Payload})
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// SetRoster records an agent's worker target (see Ledger.SetRoster).
func (c *Client) SetRoster(ctx context.Context, e protocol.RosterEntry) (protocol.RosterResult, error) {
	var out protocol.RosterResult
	msg, err := jsonMsg(c.subject(e.ProjectID, e.AgentID, protocol.OpRosterSet), e)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// GetRoster reads an agent's worker target (see Ledger.GetRoster).
func (c *Client) GetRoster(ctx context.Context, project, agentID string) (protocol.RosterResult, error) {
	var out protocol.RosterResult
	msg, err := jsonMsg(c.subject(project, "", protocol.OpRosterGet), map[string]string{"project_id": project, "agent_id": agentID})
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// GetCall reads a call record (see Ledger.GetCall).
func (c *Client) GetCall(ctx context.Context, project, turnID, callID string) (*protocol.CallRecord, error) {
	var out protocol.CallRecord
	msg, err := jsonMsg(c.subject(project, "", protocol.OpCallGet), map[string]string{"project_id": project, "agent_turn_id": turnID, "tool_call_id": callID})
	if err != nil {
		return nil, err
	}
	if err := c.call(ctx, msg, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Consume records that an agent consumed a call's result (see Ledger.Consume).
func (c *Client) Consume(ctx context.Context, req protocol.ConsumeRequest) (protocol.ConsumeResult, error) {
	return request[protocol.ConsumeResult](ctx, c, req.ProjectID, req.AgentID, protocol.OpConsume, req)
}

// ListInbox lists one page of an agent's pending results, in report order
// (inbox.list, answered by the views: docs/protocol.md#inboxlist). cursor is
// the NextCursor of the page before ("" for the first); limit 0 means the
// default page size. The request goes out as the agent, whom a worker
// credential bound to an agent must be. A worker lists its pending results
// on every (re)connect, after subscribing to its wakeups, to find the
// results whose wakeups it missed.
func (c *Client) ListInbox(ctx context.Context, project, agentID, cursor string, limit int) (protocol.InboxListResult, error) {
	var out protocol.InboxListResult
	req := protocol.InboxListRequest{ProjectID: project, AgentID: agentID, Cursor: cursor, Limit: limit}
	msg, err := jsonMsg(c.subject(project, identOr(agentID), protocol.OpInboxList), req)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// RegisterToolYAML registers a tool definition given as YAML or JSON (see
// Ledger.RegisterToolYAML).
func (c *Client) RegisterToolYAML(ctx context.Context, project string, body []byte) (protocol.RegisterResult, error) {
	var out protocol.RegisterResult
	msg := &nats.Msg{Subject: c.subject(project, "", protocol.OpToolRegister), Data: body, Header: nats.Header{}}
	return out, c.call(ctx, msg, &out)
}

// RegisterTool registers a definition built in Go (see Ledger.RegisterTool):
// its zero limits, retry fields and determinism take their defaults
// (ToolDefinition.WithDefaults), and the ledger validates it.
func (c *Client) RegisterTool(ctx context.Context, d *protocol.ToolDefinition) (protocol.RegisterResult, error) {
	body, err := json.Marshal(d.WithDefaults())
	if err != nil {
		return protocol.RegisterResult{}, fmt.Errorf("ledger client: encode tool definition: %w", err)
	}
	return c.RegisterToolYAML(ctx, d.ProjectID, body)
}

// GetTool reads a tool definition (see Ledger.GetTool).
func (c *Client) GetTool(ctx context.Context, project, tool string) (*protocol.StoredTool, error) {
	var out protocol.StoredTool
	msg, err := jsonMsg(c.subject(project, "", protocol.OpToolGet), map[string]string{"project_id": project, "tool_name": tool})
	if err != nil {
		return nil, err
	}
	if err := c.call(ctx, msg, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetToolAt reads the tool definition the entry at seq wrote (see
// Ledger.GetToolAt): tool.get with "seq".
func (c *Client) GetToolAt(ctx context.Context, project, tool string, seq uint64) (*protocol.StoredTool, error) {
	var out protocol.StoredTool
	msg, err := jsonMsg(c.subject(project, "", protocol.OpToolGet), map[string]any{"project_id": project, "tool_name": tool, "seq": seq})
	if err != nil {
		return nil, err
	}
	if err := c.call(ctx, msg, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListTools reads every tool of a project (see Ledger.ListTools).
func (c *Client) ListTools(ctx context.Context, project string) ([]protocol.StoredTool, error) {
	var out struct {
		Tools []protocol.StoredTool `json:"tools"`
	}
	msg, err := jsonMsg(c.subject(project, "", protocol.OpToolList), map[string]string{"project_id": project})
	if err != nil {
		return nil, err
	}
	return out.Tools, c.call(ctx, msg, &out)
}

// Cancel asks to cancel a call in flight (see Ledger.Cancel).
func (c *Client) Cancel(ctx context.Context, req protocol.CancelRequest) (protocol.CancelResult, error) {
	return request[protocol.CancelResult](ctx, c, req.ProjectID, req.AgentID, protocol.OpCancel, req)
}

// EnsureToolConsumer asks for the durable consumer of a tool target of a
// project (see Ledger.EnsureToolConsumer). The request goes out as the tool:
// a tool credential may ask only for its own.
func (c *Client) EnsureToolConsumer(ctx context.Context, project, tool string) (protocol.ToolConsumer, error) {
	var out protocol.ToolConsumer
	msg, err := jsonMsg(c.subject(project, tool, protocol.OpToolConsumer), struct{}{})
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// identOr returns s when it can be an actor token, else "" (the client's
// own actor).
// request sends req to op as actor (the client's own when "") in project,
// and decodes the answer.
func request[T any](ctx context.Context, c *Client, project, actor, op string, req any) (T, error) {
	var out T
	msg, err := jsonMsg(c.subject(project, actor, op), req)
	if err != nil {
		return out, err
	}
	err = c.call(ctx, msg, &out)
	return out, err
}

func identOr(s string) string {
	if protocol.ValidIdentifier(s) {
		return s
	}
	return ""
}

// Skip asks the ledger to record an operator's skip of the entry at seq
// (see Ledger.Skip); it needs an admin credential of every project.
func (c *Client) Skip(ctx context.Context, seq uint64, reason string) (protocol.SkipResult, error) {
	var out protocol.SkipResult
	msg, err := jsonMsg(protocol.APISubject(protocol.GlobalProject, c.actor, protocol.OpProjectorSkip), protocol.SkipRequest{Seq: seq, Reason: reason})
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// ViewsSnapshot asks one of the serve processes running the projector to
// take a snapshot of its views now (docs/protocol.md#viewssnapshot); it
// needs an admin credential of every project. A snapshot copies the whole
// view store: give ctx minutes, not seconds.
func (c *Client) ViewsSnapshot(ctx context.Context) (protocol.ViewsSnapshotResult, error) {
	var out protocol.ViewsSnapshotResult
	msg := &nats.Msg{Subject: protocol.APISubject(protocol.GlobalProject, c.actor, protocol.OpViewsSnapshot), Data: []byte("{}")}
	return out, c.call(ctx, msg, &out)
}

// ViewsSnapshotList lists the snapshots of the views where one of the serve
// processes running the projector keeps them, newest first
// (docs/protocol.md#viewssnapshotlist); it needs an admin credential of
// every project.
func (c *Client) ViewsSnapshotList(ctx context.Context) (protocol.ViewsSnapshotListResult, error) {
	var out protocol.ViewsSnapshotListResult
	msg := &nats.Msg{Subject: protocol.APISubject(protocol.GlobalProject, c.actor, protocol.OpViewsSnapshotList), Data: []byte("{}")}
	return out, c.call(ctx, msg, &out)
}

// Commit commits a prepared call as its agent's worker (see Ledger.Commit).
func (c *Client) Commit(ctx context.Context, req protocol.DecisionRequest) (protocol.DecisionResult, error) {
	return c.decide(ctx, protocol.OpCommit, req)
}

// Abort aborts a prepared call as its agent's worker (see Ledger.Abort).
func (c *Client) Abort(ctx context.Context, req protocol.DecisionRequest) (protocol.DecisionResult, error) {
	return c.decide(ctx, protocol.OpAbort, req)
}

func (c *Client) decide(ctx context.Context, op string, req protocol.DecisionRequest) (protocol.DecisionResult, error) {
	var out protocol.DecisionResult
	msg, err := jsonMsg(c.subject(req.ProjectID, req.AgentID, op), req)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// TwoPhase reads a call's two-phase state: call.get with two_phase (see
// Ledger.TwoPhase). Nil when the call was never prepared.
func (c *Client) TwoPhase(ctx context.Context, project, turnID, callID string) (*protocol.TwoPhase, error) {
	var out protocol.CallView
	msg, err := jsonMsg(c.subject(project, "", protocol.OpCallGet), map[string]any{"project_id": project, "agent_turn_id": turnID, "tool_call_id": callID, "two_phase": true})
	if err != nil {
		return nil, err
	}
	if err := c.call(ctx, msg, &out); err != nil {
		return nil, err
	}
	return out.TwoPhase, nil
}

// ListApprovals lists one page of a project's held calls in the order they
// were held, oldest first (approval.list, answered by the views:
// docs/protocol.md#approvallist). state is "pending" (also ""), "decided" or
// "all"; cursor is the NextCursor of the page before ("" for the first);
// limit 0 means the default page size. The request goes out as the
// client's actor (an approver credential's approver name).
func (c *Client) ListApprovals(ctx context.Context, project, state, cursor string, limit int) (protocol.ApprovalListResult, error) {
	var out protocol.ApprovalListResult
	req := protocol.ApprovalListRequest{ProjectID: project, State: state, Cursor: cursor, Limit: limit}
	msg, err := jsonMsg(c.subject(project, "", protocol.OpApprovalList), req)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// GetApproval reads one held call: its arguments, their digest, and its
// decision once there is one (approval.get, answered by the views).
func (c *Client) GetApproval(ctx context.Context, project, turnID, callID string) (protocol.ApprovalGetResult, error) {
	var out protocol.ApprovalGetResult
	req := protocol.ApprovalGetRequest{ProjectID: project, AgentTurnID: turnID, ToolCallID: callID}
	msg, err := jsonMsg(c.subject(project, "", protocol.OpApprovalGet), req)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// Approve approves a held call as approver (the actor token, which an
// approver credential must be its approver name): req names the call's
// tool.call card and the digest of its arguments (GetApproval shows both),
// so the ledger refuses it (mismatch) when they are not the call's.
func (c *Client) Approve(ctx context.Context, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
	return c.decideApproval(ctx, protocol.OpApprove, approver, req)
}

// Deny denies a held call as approver, as Approve approves one: the call
// ends failed (A-APPROVAL-DENIED) with req.Reason.
func (c *Client) Deny(ctx context.Context, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
	return c.decideApproval(ctx, protocol.OpDeny, approver, req)
}

func (c *Client) decideApproval(ctx context.Context, op, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
	var out protocol.ApprovalResult
	msg, err := jsonMsg(c.subject(req.ProjectID, identOr(approver), op), req)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// OperatorCancel cancels any agent's call as an operator (call.cancel, an
// admin's op; see Ledger.OperatorCancel). actor is the request's actor
// token, which the ledger records as the entry's CG-Actor.
func (c *Client) OperatorCancel(ctx context.Context, actor string, req protocol.OperatorCancelRequest) (protocol.OperatorCancelResult, error) {
	return request[protocol.OperatorCancelResult](ctx, c, req.ProjectID, identOr(actor), protocol.OpCallCancel, req)
}

// PauseTool pauses a tool in a project (tool.pause, an admin's op; see
// Ledger.PauseTool), as actor: its dispatches are held until ResumeTool.
func (c *Client) PauseTool(ctx context.Context, actor string, req protocol.ToolPauseRequest) (protocol.ToolPauseResult, error) {
	return request[protocol.ToolPauseResult](ctx, c, req.ProjectID, identOr(actor), protocol.OpToolPause, req)
}

// ResumeTool resumes a paused tool (tool.resume, an admin's op; see
// Ledger.ResumeTool), as actor: the calls held meanwhile are published in
// dispatch order.
func (c *Client) ResumeTool(ctx context.Context, actor string, req protocol.ToolPauseRequest) (protocol.ToolPauseResult, error) {
	return request[protocol.ToolPauseResult](ctx, c, req.ProjectID, identOr(actor), protocol.OpToolResume, req)
}

// Resolve records what became of an outcome_unknown call's side effect
// (call.resolve, an admin's op; see Ledger.Resolve), as actor.
func (c *Client) Resolve(ctx context.Context, actor string, req protocol.ResolveRequest) (protocol.ResolveResult, error) {
	return request[protocol.ResolveResult](ctx, c, req.ProjectID, identOr(actor), protocol.OpCallResolve, req)
}

// Redrive runs a failed or timed-out call again as a derived call
// <root>~r<n> (call.redrive, an admin's op; see Ledger.Redrive), as actor.
func (c *Client) Redrive(ctx context.Context, actor string, req protocol.RedriveRequest) (protocol.RedriveResult, error) {
	return request[protocol.RedriveResult](ctx, c, req.ProjectID, identOr(actor), protocol.OpCallRedrive, req)
}

// RedriveOf reads a call's redrive from call.get (see Ledger.RedriveOf):
// nil when it has none.
func (c *Client) RedriveOf(ctx context.Context, project, turnID, callID string) (*protocol.RedriveEntry, error) {
	var out protocol.CallView
	msg, err := jsonMsg(c.subject(project, "", protocol.OpCallGet), map[string]any{"project_id": project, "agent_turn_id": turnID, "tool_call_id": callID})
	if err != nil {
		return nil, err
	}
	if err := c.call(ctx, msg, &out); err != nil {
		return nil, err
	}
	return out.Redrive, nil
}

// Resolution reads a call's resolution from call.get (see
// Ledger.Resolution): nil when it has none.
func (c *Client) Resolution(ctx context.Context, project, turnID, callID string) (*protocol.ResolutionEntry, error) {
	var out protocol.CallView
	msg, err := jsonMsg(c.subject(project, "", protocol.OpCallGet), map[string]any{"project_id": project, "agent_turn_id": turnID, "tool_call_id": callID})
	if err != nil {
		return nil, err
	}
	if err := c.call(ctx, msg, &out); err != nil {
		return nil, err
	}
	return out.Resolution, nil
}

// ConformanceCommand asks the ledger to append a tool command for a
// conformance run (conformance.command, an admin's op), as actor: the
// headers and payload as given, marked as the run's.
func (c *Client) ConformanceCommand(ctx context.Context, actor string, req protocol.ConformanceCommandRequest) (protocol.ConformanceCommandResult, error) {
	return request[protocol.ConformanceCommandResult](ctx, c, req.ProjectID, actor, protocol.OpConformanceCommand, req)
}

// ConformanceObserve reads a project's entries from a sequence on and the
// consumers of a tool target (conformance.observe, an admin's read), as the
// client's actor, as every read does.
func (c *Client) ConformanceObserve(ctx context.Context, req protocol.ConformanceObserveRequest) (protocol.ConformanceObserveResult, error) {
	return request[protocol.ConformanceObserveResult](ctx, c, req.ProjectID, "", protocol.OpConformanceObserve, req)
}
