package client

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/protocol"
)

// The reads and writes an executor makes besides dispatching and reporting,
// so that an executor in another process runs on a Client as on an
// in-process ledger.

// GetCard reads one card (see Ledger.GetCard): an error matching
// protocol.ErrUnknownCard when the project has no such card.
func (c *Client) GetCard(ctx context.Context, project, cardID string) (*protocol.StoredCard, error) {
	cards, _, err := c.GetCards(ctx, project, []string{cardID})
	if err != nil {
		return nil, err
	}
	for i := range cards {
		if cards[i].Card.CardID == cardID {
			return &cards[i], nil
		}
	}
	return nil, protocol.NewError(protocol.CodeUnknownCard, nil, "card %s not found in project %s", cardID, project)
}

// Canceled reports whether a cancellation was recorded for the call (see
// Ledger.Canceled).
func (c *Client) Canceled(ctx context.Context, project, channel, turnID, callID string) (bool, error) {
	var out protocol.CancelState
	msg, err := jsonMsg(c.subject(project, "", protocol.OpCancelGet),
		protocol.CallRef{ProjectID: project, ChannelID: channel, AgentTurnID: turnID, ToolCallID: callID})
	if err != nil {
		return false, err
	}
	return out.Canceled, c.call(ctx, msg, &out)
}

// Resume finishes a call whose report is stored but whose agent was not
// woken (see Ledger.Resume). The ledger takes it only from the call's tool,
// so the client reads the call first and asks as the tool its command
// subject targets (resuming is rare: a redelivered command).
func (c *Client) Resume(ctx context.Context, project, turnID, callID string) (protocol.ReportOutcome, error) {
	var out protocol.ReportOutcome
	rec, err := c.GetCall(ctx, project, turnID, callID)
	if err != nil {
		return out, err
	}
	msg, err := jsonMsg(c.subject(project, commandTool(rec.Subject), protocol.OpResume),
		protocol.CallRef{ProjectID: project, AgentTurnID: turnID, ToolCallID: callID})
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// RejectCommand records that a tool command received on subject was
// refused, with the command as received (see Ledger.RejectCommand). On
// success e.Seq is the rejection entry's sequence. The request goes out as
// the subject's tool target, which the ledger requires. An error means the
// refusal was not recorded: the caller retries (an executor leaves the
// command unacked).
func (c *Client) RejectCommand(ctx context.Context, subject string, h nats.Header, data []byte, e *protocol.Error) error {
	var out protocol.RejectionResult
	project := protocol.SubjectProject(subject)
	msg, err := jsonMsg(c.subject(project, commandTool(subject), protocol.OpCommandReject),
		protocol.CommandRejection{Subject: subject, Headers: h, Data: data, Error: e})
	if err != nil {
		return err
	}
	if err := c.call(ctx, msg, &out); err != nil {
		return err
	}
	e.Seq = out.Seq
	return nil
}

// ReadExecutionInputs reads the call record, the cancellation, the tool.call
// card and the tool definition at once (see Ledger.ReadExecutionInputs),
// each from the server: q.Fresh makes no difference here.
func (c *Client) ReadExecutionInputs(ctx context.Context, q protocol.ExecutionQuery) protocol.ExecutionInputs {
	var in protocol.ExecutionInputs
	var wg sync.WaitGroup
	if !q.SkipCancel {
		wg.Go(func() {
			in.Canceled, in.CancelErr = c.Canceled(ctx, q.Project, q.Channel, q.AgentTurnID, q.ToolCallID)
		})
	}
	wg.Go(func() { in.Card, in.CardErr = c.GetCard(ctx, q.Project, q.ToolCallCardID) })
	if protocol.ValidIdentifier(q.ToolName) {
		wg.Go(func() { in.Tool, in.ToolErr = c.GetTool(ctx, q.Project, q.ToolName) })
	}
	in.Record, in.RecordErr = c.GetCall(ctx, q.Project, q.AgentTurnID, q.ToolCallID)
	wg.Wait()
	// The definition the call pinned at dispatch, when a new one was
	// registered since: one more read, only then.
	if pin := protocol.PinnedToolSeq(in.Record, in.RecordErr, in.Tool, q.ToolName); pin != 0 {
		in.Tool, in.ToolErr = c.GetToolAt(ctx, q.Project, q.ToolName, pin)
	}
	return in
}

// commandTool is the tool target of a tool command subject
// (cg.<ver>.<project>.<channel>.cmd.tool.<target>...), or "" (the client's
// own actor) when the subject has none that can be an actor token.
func commandTool(subject string) string {
	return identOr(protocol.CommandTarget(subject))
}

// callTool is the actor a tool operation on a call goes out as: the
// client's own when it was given one, else the tool the call's command
// subject targets (read from the call), which the ledger requires.
func (c *Client) callTool(ctx context.Context, project, turnID, callID string) (string, error) {
	if c.actorSet {
		return "", nil
	}
	rec, err := c.GetCall(ctx, project, turnID, callID)
	if err != nil {
		return "", err
	}
	return commandTool(rec.Subject), nil
}

// StartAttempt records an attempt of a side_effectful tool before it runs,
// or answers which attempt is open (see Ledger.StartAttempt). The ledger
// takes it only from the call's tool: unless the client was given an
// actor, it reads the call first and asks as the tool its command subject
// targets.
func (c *Client) StartAttempt(ctx context.Context, req protocol.AttemptStartRequest) (protocol.AttemptStartResult, error) {
	var out protocol.AttemptStartResult
	actor, err := c.callTool(ctx, req.ProjectID, req.AgentTurnID, req.ToolCallID)
	if err != nil {
		return out, err
	}
	msg, err := jsonMsg(c.subject(req.ProjectID, actor, protocol.OpAttemptStart), req)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}

// Prepare records that a call's tool prepared it, with a commit token and a
// commit deadline (see Ledger.Prepare). As StartAttempt, it asks as the
// tool the call's command subject targets unless the client has an actor.
func (c *Client) Prepare(ctx context.Context, req protocol.PrepareRequest) (protocol.PrepareResult, error) {
	var out protocol.PrepareResult
	actor, err := c.callTool(ctx, req.ProjectID, req.AgentTurnID, req.ToolCallID)
	if err != nil {
		return out, err
	}
	msg, err := jsonMsg(c.subject(req.ProjectID, actor, protocol.OpPrepare), req)
	if err != nil {
		return out, err
	}
	return out, c.call(ctx, msg, &out)
}
