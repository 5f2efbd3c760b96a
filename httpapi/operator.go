package httpapi

import (
	"context"
	"net/http"

	"github.com/cgledger/cgledger/protocol"
)

// OperateFunc sends an operator action to the ledger as actor (the admin's
// actor token) and returns its answer: op protocol.OpCallCancel with a
// protocol.OperatorCancelRequest, protocol.OpCallResolve with a
// protocol.ResolveRequest, or protocol.OpCallRedrive with a
// protocol.RedriveRequest. serve sends it over NATS (client.Client
// OperatorCancel, Resolve and Redrive) so that it is checked and recorded
// as an admin's own request is.
type OperateFunc func(ctx context.Context, op, actor string, req any) (any, error)

// operate serves POST .../turns/{turn}/calls/{call}/cancel, .../resolve and
// .../redrive: the path names the call, the body the reason (and, for
// resolve, the effect); the actor is the bearer credential's
// (HTTPConfig.Operator).
func (h *handler) operate(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		actor, fromBody := bearerName(h.cfg.Operator, r)
		var req any
		parse := func(body []byte) protocol.Violations {
			var vs protocol.Violations
			req, vs = parseOperatorBody(r, op, body, fromBody, &actor)
			return vs
		}
		var send func(ctx context.Context) (any, error)
		if h.cfg.Operate != nil {
			send = func(ctx context.Context) (any, error) { return h.cfg.Operate(ctx, op, actor, req) }
		}
		postOnCall(w, r, op, parse, send, "operator actions are not taken through this server (it reaches no ledger API)")
	}
}

// parseOperatorBody reads a cancel, resolve or redrive body, the call taken from the
// path, listing every violation (the path's ids and the body's fields,
// checked as the ledger checks the request). fromBody says the actor is
// the body's "actor" (a serve without credentials), which actor receives.
// A member the op does not take is named here, with the members an HTTP
// body takes.
func parseOperatorBody(r *http.Request, op string, body []byte, fromBody bool, actor *string) (any, protocol.Violations) {
	whole, vs := callBody{r: r, body: body, who: "actor", whose: "the bearer credential's", fromBody: fromBody, name: actor, op: op}.request()
	if whole == nil {
		return nil, vs
	}
	var req any
	var rvs protocol.Violations
	switch op {
	case protocol.OpCallResolve:
		req, rvs = protocol.ParseResolveRequest(whole)
	case protocol.OpCallRedrive:
		req, rvs = protocol.ParseRedriveRequest(whole)
	default:
		req, rvs = protocol.ParseOperatorCancelRequest(whole)
	}
	return req, append(vs, pathNamed(rvs)...)
}
