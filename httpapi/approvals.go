package httpapi

import (
	"context"
	"net/http"

	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// DecideFunc sends an approve or deny request (op protocol.OpApprove or
// OpDeny) to the ledger as approver and returns its answer; serve sends it
// over NATS (client.Client.Approve and Deny) so that it is checked and
// recorded as every other approver's request is.
type DecideFunc func(ctx context.Context, op, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error)

func (h *handler) approvals(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	project, state := r.PathValue("project"), p.str("state")
	p.ids("project_id", project)
	at := p.asOf()
	limit := p.limit()
	var belongs projector.CursorCheck
	if state == "" || projector.ValidApprovalState(state) {
		belongs = projector.ApprovalsCursor(project, state)
	} else {
		p.vs.Add("state", protocol.VInvalidValue, "must be pending, decided or all (none: pending), got %q", protocol.Clip(state))
	}
	cursor := p.cursor(belongs)
	if p.done(w) {
		return
	}
	res, err := h.q.Approvals(project, state, at, cursor, limit)
	reply(w, res, err)
}

func (h *handler) approval(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	project, turn, call := r.PathValue("project"), r.PathValue("turn"), r.PathValue("call")
	p.ids("project_id", project, "agent_turn_id", turn, "tool_call_id", call)
	at := p.asOf()
	if p.done(w) {
		return
	}
	item, seq, err := h.q.Approval(project, turn, call, at)
	if err != nil {
		Error(w, err)
		return
	}
	reply(w, projector.ApprovalAnswer{AsOfSeq: seq, Approval: *item}, nil)
}

// decide serves POST .../approve and .../deny: the body names the card and
// the digest of its arguments (and a reason); the path names the call.
// The approver is the bearer credential's (HTTPConfig.Approver).
func (h *handler) decide(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		approver, fromBody := bearerName(h.cfg.Approver, r)
		if !fromBody && !protocol.ValidIdentifier(approver) {
			Error(w, &protocol.Error{Code: protocol.CodeForbidden, Message: "the bearer credential names no approver: " + op + " needs an approver credential of the project (cgledger creds issue --role approver --approver NAME)"})
			return
		}
		var req protocol.ApprovalRequest
		parse := func(body []byte) protocol.Violations {
			var vs protocol.Violations
			req, vs = parseDecisionBody(r, op, body, fromBody, &approver)
			return vs
		}
		var send func(ctx context.Context) (any, error)
		if h.cfg.Decide != nil {
			send = func(ctx context.Context) (any, error) { return h.cfg.Decide(ctx, op, approver, req) }
		}
		postOnCall(w, r, op, parse, send, "approvals are not decided through this server (it reaches no ledger API)")
	}
}

// parseDecisionBody reads an approve or deny body, the call taken from the
// path, listing every violation (the path's ids and the body's fields,
// checked as the ledger checks the request). fromBody says the approver
// is the body's "approver" (a serve without credentials), which approver
// receives. A member the decision does not take is named here, with the
// members an HTTP body takes.
func parseDecisionBody(r *http.Request, op string, body []byte, fromBody bool, approver *string) (protocol.ApprovalRequest, protocol.Violations) {
	whole, vs := callBody{
		r: r, body: body, who: "approver", whose: "the bearer credential's approver name", fromBody: fromBody, name: approver, op: op,
	}.request()
	if whole == nil {
		return protocol.ApprovalRequest{}, vs
	}
	req, rvs := protocol.ParseApprovalRequest(whole)
	return req, append(vs, pathNamed(rvs)...)
}

// decisionError answers a refused approve or deny: its problem details
// with the status of its code (a call decided already, or not held,
// conflicts: 409; the card or digest not the call's: 409 too; an unknown
// call: 404).
func decisionError(w http.ResponseWriter, err error) {
	d := Problem(err)
	status := d.Status
	switch protocol.Code(d.Code) {
	case protocol.CodeConflict, protocol.CodeMismatch:
		status = http.StatusConflict
	case protocol.CodeUnknownCall:
		status = http.StatusNotFound
	}
	if status != d.Status {
		vs := d.Violations
		d = problem.New(status, d.Code, d.Detail, vs).WithRejection(d.RejectionSeq)
	}
	problem.Write(w, d)
}
