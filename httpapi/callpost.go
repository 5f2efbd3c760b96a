package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/cgledger/cgledger/protocol"
)

// maxCallBody bounds the body of a POST on one call (approve, deny,
// cancel, resolve).
const maxCallBody = 16 << 10

// bearerName is the name the bearer credential acts under (an approver's
// name, an admin's actor token), fromBody when this server has no
// credentials to take it from and the body names it instead.
func bearerName(name func(*http.Request) (string, bool), r *http.Request) (n string, fromBody bool) {
	if name != nil {
		if n, ok := name(r); ok {
			return n, false
		}
	}
	return "", true
}

// postOnCall answers a POST on one call: it reads the body, parses it with
// parse (every violation listed at once) and sends the request to the
// ledger with send, which is nil when this server reaches no ledger API
// (unavailable then says which requests it does not take). The ledger's
// refusals are answered by decisionError.
func postOnCall(w http.ResponseWriter, r *http.Request, op string, parse func(body []byte) protocol.Violations, send func(ctx context.Context) (any, error), unavailable string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxCallBody+1))
	if err != nil {
		Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "cannot read body: " + err.Error()})
		return
	}
	if vs := parse(body); len(vs) > 0 {
		Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid " + op + " request", Violations: vs})
		return
	}
	if send == nil {
		Error(w, &protocol.Error{Code: protocol.CodeNotFound, Message: unavailable})
		return
	}
	res, err := send(r.Context())
	if err != nil {
		decisionError(w, err)
		return
	}
	Write(w, http.StatusOK, res)
}

// callBody is a POST on one call's body: the JSON object its op's parser
// takes is the path's ids plus the body's other members.
type callBody struct {
	r    *http.Request
	body []byte
	// who is the body member naming whom the request acts as ("approver",
	// "actor"), whose is why the body may not name it otherwise.
	who, whose string
	// fromBody says who is taken from the body (a serve without
	// credentials), into name.
	fromBody bool
	name     *string
	// members, when set, are the only body members passed on; nil passes
	// every member but the path's ids and who, so the op's parser names
	// any it does not take.
	members []string
	// op, when its request's members are known (protocol.RequestMembers),
	// makes this refuse every other body member itself, naming the
	// members an HTTP body takes (not the path's ids, which the op's
	// parser would name).
	op string
}

// request is the op's request JSON, with every violation of the path's ids
// and of who found on the way. nil JSON means the body is no object.
func (c callBody) request() ([]byte, protocol.Violations) {
	var vs protocol.Violations
	if len(c.body) > maxCallBody {
		vs.Add("body", protocol.VTooLarge, "is more than %d bytes", maxCallBody)
		return nil, vs
	}
	o, ok := protocol.ParseObject("body", c.body, &vs)
	if !ok {
		return nil, vs
	}
	fields := map[string]any{
		"project_id": c.r.PathValue("project"), "agent_turn_id": c.r.PathValue("turn"), "tool_call_id": c.r.PathValue("call"),
	}
	if c.members != nil {
		for _, f := range c.members {
			if raw := o.Raw(f); raw != nil {
				fields[f] = raw
			}
		}
	}
	for _, f := range []string{"project_id", "agent_turn_id", "tool_call_id"} {
		if o.Has(f) {
			vs.Add(o.Path(f), protocol.VInvalidValue, "is taken from the path: leave it out of the body")
		}
	}
	switch {
	case c.fromBody:
		*c.name = o.Ident(c.who, true)
	case o.Has(c.who):
		vs.Add(o.Path(c.who), protocol.VInvalidValue, "is %s: leave it out of the body", c.whose)
	}
	if c.members == nil {
		taken := protocol.RequestMembers(c.op)
		var httpMembers []string
		for _, m := range taken {
			switch m {
			case "project_id", "agent_turn_id", "tool_call_id":
			default:
				httpMembers = append(httpMembers, m)
			}
		}
		if c.fromBody {
			httpMembers = append(httpMembers, c.who)
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(c.body, &members); err == nil {
			for _, k := range slices.Sorted(maps.Keys(members)) {
				switch {
				case k == "project_id" || k == "agent_turn_id" || k == "tool_call_id" || k == c.who:
				case taken == nil || slices.Contains(taken, k):
					fields[k] = members[k]
				default:
					vs.Add(o.Path(k), protocol.VInvalidValue, "is not a member of a %s body over HTTP (%s; the path names the call)", c.op, strings.Join(httpMembers, ", "))
				}
			}
		}
	}
	whole, err := json.Marshal(fields)
	if err != nil {
		vs.Add("body", protocol.VInvalidValue, "cannot be encoded: %v", err)
		return nil, vs
	}
	return whole, vs
}

// pathNamed names the violations of the path's ids, which the op's parser
// reports as the request's, as the path's parameters.
func pathNamed(vs protocol.Violations) protocol.Violations {
	for i, v := range vs {
		switch v.Field {
		case "body.project_id":
			vs[i].Field = "project_id"
		case "body.agent_turn_id":
			vs[i].Field = "agent_turn_id"
		case "body.tool_call_id":
			vs[i].Field = "tool_call_id"
		}
	}
	return vs
}
