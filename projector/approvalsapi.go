package projector

import (
	"context"

	"github.com/cgledger/cgledger/protocol"
)

// parseApprovalList reads an approval.list body, listing every violation,
// a cursor of another listing (project or state) among them.
func parseApprovalList(body []byte) (protocol.ApprovalListRequest, error) {
	var vs protocol.Violations
	var req protocol.ApprovalListRequest
	if o, ok := protocol.ParseObject("body", body, &vs); ok {
		req.ProjectID = o.Ident("project_id", true)
		req.State = o.Str("state", false)
		stateOK := req.State == "" || ValidApprovalState(req.State)
		if !stateOK {
			vs.Add("body.state", protocol.VInvalidValue, "must be pending, decided or all (none: pending), got %q", protocol.Clip(req.State))
		}
		req.Cursor = o.Str("cursor", false)
		req.Limit = bodyLimit(o, &vs)
		if req.Cursor != "" && stateOK && protocol.ValidIdentifier(req.ProjectID) {
			if _, err := decodeSeqCursor(req.Cursor, approvalsScope(req.ProjectID, req.State)); err != nil {
				vs.Add("body.cursor", protocol.VInvalidValue, "is not a cursor of this project's approvals in this state: pass the next_cursor of the page before, or leave it out for the first page")
			}
		}
	}
	return req, protocol.BadRequest("approval.list request", vs)
}

// parseApprovalGet reads an approval.get body, listing every violation.
func parseApprovalGet(body []byte) (protocol.ApprovalGetRequest, error) {
	var vs protocol.Violations
	var req protocol.ApprovalGetRequest
	if o, ok := protocol.ParseObject("body", body, &vs); ok {
		req.ProjectID = o.Ident("project_id", true)
		req.AgentTurnID, req.ToolCallID = o.Ident("agent_turn_id", true), o.Ident("tool_call_id", true)
	}
	return req, protocol.BadRequest("approval.get request", vs)
}

// approvalList answers one page of the caller's project's held calls once
// the views have applied what the ledger held when the request arrived (or
// MaxWait has passed), as inbox.list does.
func (s *APIServer) approvalList(ctx context.Context, c protocol.Caller, body []byte) (protocol.ApprovalListResult, error) {
	req, err := parseApprovalList(body)
	if err != nil {
		return protocol.ApprovalListResult{}, err
	}
	last, err := s.ledgerSeq(ctx)
	if err != nil {
		return protocol.ApprovalListResult{}, err
	}
	s.waitApplied(ctx, last)
	page, err := s.q.Approvals(c.Project, req.State, AsOf{}, req.Cursor, req.Limit)
	if err != nil {
		return protocol.ApprovalListResult{}, err
	}
	return protocol.ApprovalListResult{AsOfSeq: page.AsOfSeq, LedgerSeq: last, Items: page.Items, NextCursor: page.NextCursor}, nil
}

// approvalGet answers one held call of the caller's project, as
// approvalList waits for the views.
func (s *APIServer) approvalGet(ctx context.Context, c protocol.Caller, body []byte) (protocol.ApprovalGetResult, error) {
	req, err := parseApprovalGet(body)
	if err != nil {
		return protocol.ApprovalGetResult{}, err
	}
	last, err := s.ledgerSeq(ctx)
	if err != nil {
		return protocol.ApprovalGetResult{}, err
	}
	s.waitApplied(ctx, last)
	item, seq, err := s.q.Approval(c.Project, req.AgentTurnID, req.ToolCallID, AsOf{})
	if err != nil {
		return protocol.ApprovalGetResult{}, err
	}
	return protocol.ApprovalGetResult{AsOfSeq: seq, LedgerSeq: last, Approval: *item}, nil
}
