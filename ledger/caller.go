package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/cgledger/cgledger/protocol"
)

type callerKey struct{}

// WithCaller marks ctx as serving a request from c, for the typed Go
// methods (Dispatch, Report, Approve...): each reads it once, where the
// request enters, and passes it down as the request's caller, whose actor
// the entries it writes record as CG-Actor. The API server passes the
// caller of a request's subject the same way, without ctx.
func WithCaller(ctx context.Context, c protocol.Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// atEdge is where a typed operator request (Approve, PauseTool,
// OperatorCancel...) enters: the caller it is made for is read once, here.
// A call from Go with no caller in ctx is actor's, of project, as the API's
// request would be.
func atEdge(ctx context.Context, project, actor string) *protocol.Caller {
	if c, ok := CallerFrom(ctx); ok {
		return &c
	}
	return &protocol.Caller{Project: project, Actor: actor}
}

// rawOf is a typed request as a refusal records it: the JSON body the API
// would have received, encoded only when it is refused.
func rawOf(req any) func() protocol.RejectedRequest {
	return func() protocol.RejectedRequest {
		// Structs of strings and numbers: the encoding cannot fail.
		body, _ := json.Marshal(req)
		return protocol.NewRejectedRequest("", nil, body)
	}
}

// rawBody is a received request as a refusal records it.
func rawBody(body []byte) func() protocol.RejectedRequest {
	return func() protocol.RejectedRequest { return protocol.NewRejectedRequest("", nil, body) }
}

// viaWire runs a typed request that is not certainly valid the way of its
// API body (run), so its parser names every violation and its refusal is
// recorded exactly as the API's is.
func viaWire[Res any](ctx context.Context, op string, req any, run func(ctx context.Context, body []byte) (Res, error)) (Res, error) {
	body, err := json.Marshal(req)
	if err != nil {
		var zero Res
		return zero, fmt.Errorf("%s: encode: %w", op, err)
	}
	return run(ctx, body)
}

// certainText reports whether s is a free-text member (a reason) that the
// API's parser reads back from its JSON unchanged and without a violation:
// valid UTF-8 (the encoder replaces anything else), at most limit bytes,
// present when required.
func certainText(s string, limit int, required bool) bool {
	return (s != "" || !required) && len(s) <= limit && utf8.ValidString(s)
}

// CallerFrom returns the caller ctx serves, if any.
func CallerFrom(ctx context.Context) (protocol.Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(protocol.Caller)
	return c, ok
}

// callerOf is CallerFrom as the explicit argument of a parsed request: nil
// for a request made in process, which no caller check applies to and
// whose entries name no actor. Only the typed Go methods read it, once,
// where their request enters.
func callerOf(ctx context.Context) *protocol.Caller {
	if c, ok := CallerFrom(ctx); ok {
		return &c
	}
	return nil
}

// callerOwnsCall checks that a report comes from the tool its call was
// dispatched to: the actor of a report is the command subject's tool target
// (or PMO tool). c is the caller the request was parsed with at its edge;
// reports made in process (nil) are not checked.
func callerOwnsCall(c *protocol.Caller, rec *protocol.CallRecord) protocol.Violations {
	if c == nil {
		return nil
	}
	sub, err := protocol.ParseSubject(rec.Subject)
	if err != nil {
		return nil
	}
	tool := sub.Tool
	if sub.Kind == protocol.SubjectToolCommand && len(sub.Target) > 0 {
		tool = sub.Target[0]
	}
	var vs protocol.Violations
	if tool != c.Actor {
		vs.Add("subject", protocol.VForbidden, "call %s was dispatched to tool %q; the request's actor is %q", rec.ToolCallID, tool, c.Actor)
	}
	return vs
}
