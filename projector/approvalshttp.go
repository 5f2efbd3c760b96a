package projector

import (
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/cgledger/cgledger/internal/httpjson"
	"github.com/cgledger/cgledger/internal/httpjson/problem"
	"github.com/cgledger/cgledger/protocol"
)

// ApprovalAnswer is the body of GET .../approvals/{turn}/{call}.
type ApprovalAnswer struct {
	AsOfSeq  uint64       `json:"as_of_seq"`
	Approval ApprovalItem `json:"approval"`
}

// DecideFunc sends an approve or deny request (op protocol.OpApprove or
// OpDeny) to the ledger as approver and returns its answer; serve sends it
// over NATS (client.Client.Approve and Deny) so that it is checked and
// recorded as every other approver's request is.
type DecideFunc func(ctx context.Context, op, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error)

// maxDecisionBody bounds the body of an approve or deny POST.
const maxDecisionBody = 16 << 10

func (h *handler) approvals(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	project, state := r.PathValue("project"), p.str("state")
	p.ids("project_id", project)
	at := p.asOf()
	limit := p.limit()
	var belongs cursorCheck
	if state == "" || validApprovalState(state) {
		belongs = approvalsCursor(project, state)
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
		httpjson.Error(w, err)
		return
	}
	reply(w, ApprovalAnswer{AsOfSeq: seq, Approval: *item}, nil)
}

// decide serves POST .../approve and .../deny: the body names the card and
// the digest of its arguments (and a reason); the path names the call.
// The approver is the bearer credential's (HTTPConfig.Approver).
func (h *handler) decide(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		approver, fromBody := "", true
		if h.cfg.Approver != nil {
			var ok bool
			if approver, ok = h.cfg.Approver(r); ok {
				fromBody = false
			}
		}
		if !fromBody && !protocol.ValidIdentifier(approver) {
			httpjson.Error(w, &protocol.Error{Code: protocol.CodeForbidden, Message: "the bearer credential names no approver: " + op + " needs an approver credential of the project (cgledger creds issue --role approver --approver NAME)"})
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxDecisionBody+1))
		if err != nil {
			httpjson.Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "cannot read body: " + err.Error()})
			return
		}
		req, vs := parseDecisionBody(r, body, fromBody, &approver)
		if len(vs) > 0 {
			httpjson.Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid " + op + " request", Violations: vs})
			return
		}
		if h.cfg.Decide == nil {
			httpjson.Error(w, &protocol.Error{Code: protocol.CodeNotFound, Message: "approvals are not decided through this server (it reaches no ledger API)"})
			return
		}
		res, err := h.cfg.Decide(r.Context(), op, approver, req)
		if err != nil {
			decisionError(w, err)
			return
		}
		httpjson.Write(w, http.StatusOK, res)
	}
}

// parseDecisionBody reads an approve or deny body, the call taken from the
// path, listing every violation (the path's ids and the body's fields,
// checked as the ledger checks the request). fromBody says the approver
// is the body's "approver" (a serve without credentials), which approver
// receives.
func parseDecisionBody(r *http.Request, body []byte, fromBody bool, approver *string) (protocol.ApprovalRequest, protocol.Violations) {
	var vs protocol.Violations
	if len(body) > maxDecisionBody {
		vs.Add("body", protocol.VTooLarge, "is more than %d bytes", maxDecisionBody)
		return protocol.ApprovalRequest{}, vs
	}
	o, ok := protocol.ParseObject("body", body, &vs)
	if !ok {
		return protocol.ApprovalRequest{}, vs
	}
	fields := map[string]any{
		"project_id": r.PathValue("project"), "agent_turn_id": r.PathValue("turn"), "tool_call_id": r.PathValue("call"),
	}
	for _, f := range []string{"tool_call_card_id", "arguments_digest", "reason"} {
		if raw := o.Raw(f); raw != nil {
			fields[f] = raw
		}
	}
	for _, f := range []string{"project_id", "agent_turn_id", "tool_call_id"} {
		if o.Has(f) {
			vs.Add(o.Path(f), protocol.VInvalidValue, "is taken from the path: leave it out of the body")
		}
	}
	switch {
	case fromBody:
		*approver = o.Ident("approver", true)
	case o.Has("approver"):
		vs.Add(o.Path("approver"), protocol.VInvalidValue, "is the bearer credential's approver name: leave it out of the body")
	}
	whole, err := json.Marshal(fields)
	if err != nil {
		vs.Add("body", protocol.VInvalidValue, "cannot be encoded: %v", err)
		return protocol.ApprovalRequest{}, vs
	}
	req, rvs := protocol.ParseApprovalRequest(whole)
	for _, v := range rvs {
		// The path's ids are named as the path's parameters.
		switch v.Field {
		case "body.project_id":
			v.Field = "project_id"
		case "body.agent_turn_id":
			v.Field = "agent_turn_id"
		case "body.tool_call_id":
			v.Field = "tool_call_id"
		}
		vs = append(vs, v)
	}
	return req, vs
}

// decisionError answers a refused approve or deny: its problem details
// with the status of its code (a call decided already, or not held,
// conflicts: 409; the card or digest not the call's: 409 too; an unknown
// call: 404).
func decisionError(w http.ResponseWriter, err error) {
	d := httpjson.Problem(err)
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
