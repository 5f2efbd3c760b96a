package projector

import (
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/cgledger/cgledger/internal/httpjson"
	"github.com/cgledger/cgledger/protocol"
)

// OperateFunc sends an operator action to the ledger as actor (the admin's
// actor token) and returns its answer: op protocol.OpCallCancel with a
// protocol.OperatorCancelRequest, or protocol.OpCallResolve with a
// protocol.ResolveRequest. serve sends it over NATS (client.Client
// OperatorCancel and Resolve) so that it is checked and recorded as an
// admin's own request is.
type OperateFunc func(ctx context.Context, op, actor string, req any) (any, error)

// maxOperatorBody bounds the body of a cancel or resolve POST.
const maxOperatorBody = 16 << 10

// operate serves POST .../turns/{turn}/calls/{call}/cancel and .../resolve:
// the path names the call, the body the reason (and, for resolve, the
// effect); the actor is the bearer credential's (HTTPConfig.Operator).
func (h *handler) operate(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		actor, fromBody := "", true
		if h.cfg.Operator != nil {
			var ok bool
			if actor, ok = h.cfg.Operator(r); ok {
				fromBody = false
			}
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxOperatorBody+1))
		if err != nil {
			httpjson.Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "cannot read body: " + err.Error()})
			return
		}
		req, vs := parseOperatorBody(r, op, body, fromBody, &actor)
		if len(vs) > 0 {
			httpjson.Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid " + op + " request", Violations: vs})
			return
		}
		if h.cfg.Operate == nil {
			httpjson.Error(w, &protocol.Error{Code: protocol.CodeNotFound, Message: "operator actions are not taken through this server (it reaches no ledger API)"})
			return
		}
		res, err := h.cfg.Operate(r.Context(), op, actor, req)
		if err != nil {
			decisionError(w, err)
			return
		}
		httpjson.Write(w, http.StatusOK, res)
	}
}

// parseOperatorBody reads a cancel or resolve body, the call taken from the
// path, listing every violation (the path's ids and the body's fields,
// checked as the ledger checks the request). fromBody says the actor is
// the body's "actor" (a serve without credentials), which actor receives.
func parseOperatorBody(r *http.Request, op string, body []byte, fromBody bool, actor *string) (any, protocol.Violations) {
	var vs protocol.Violations
	if len(body) > maxOperatorBody {
		vs.Add("body", protocol.VTooLarge, "is more than %d bytes", maxOperatorBody)
		return nil, vs
	}
	o, ok := protocol.ParseObject("body", body, &vs)
	if !ok {
		return nil, vs
	}
	fields := map[string]any{
		"project_id": r.PathValue("project"), "agent_turn_id": r.PathValue("turn"), "tool_call_id": r.PathValue("call"),
	}
	for _, f := range []string{"project_id", "agent_turn_id", "tool_call_id"} {
		if o.Has(f) {
			vs.Add(o.Path(f), protocol.VInvalidValue, "is taken from the path: leave it out of the body")
		}
	}
	switch {
	case fromBody:
		*actor = o.Ident("actor", true)
	case o.Has("actor"):
		vs.Add(o.Path("actor"), protocol.VInvalidValue, "is the bearer credential's: leave it out of the body")
	}
	// Every other member goes to the op's parser, which names any it does
	// not take.
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err == nil {
		for k, v := range members {
			switch k {
			case "project_id", "agent_turn_id", "tool_call_id", "actor":
			default:
				fields[k] = v
			}
		}
	}
	whole, err := json.Marshal(fields)
	if err != nil {
		vs.Add("body", protocol.VInvalidValue, "cannot be encoded: %v", err)
		return nil, vs
	}
	var req any
	var rvs protocol.Violations
	if op == protocol.OpCallResolve {
		req, rvs = protocol.ParseResolveRequest(whole)
	} else {
		req, rvs = protocol.ParseOperatorCancelRequest(whole)
	}
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
