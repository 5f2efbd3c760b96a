package ledger

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cgledger/cgledger/protocol"
)

type callerKey struct{}

// WithCaller marks ctx as serving a request from c: entries written under it
// carry CG-Actor.
func WithCaller(ctx context.Context, c protocol.Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// asBody runs a typed request of op (Approve, PauseTool, Resolve...) the
// way of its API body (run), so it is checked and recorded exactly as the
// API's is. Without a caller in ctx (a call from Go, not from the API), the
// request is actor's, of project.
func asBody[Res any](ctx context.Context, op, project, actor string, req any, run func(ctx context.Context, body []byte) (Res, error)) (Res, error) {
	body, err := json.Marshal(req)
	if err != nil {
		var zero Res
		return zero, fmt.Errorf("%s: encode: %w", op, err)
	}
	if _, ok := CallerFrom(ctx); !ok {
		ctx = WithCaller(ctx, protocol.Caller{Project: project, Actor: actor})
	}
	return run(ctx, body)
}

// CallerFrom returns the caller ctx serves, if any.
func CallerFrom(ctx context.Context) (protocol.Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(protocol.Caller)
	return c, ok
}

// callerOf is CallerFrom as the explicit field of a parsed request: nil for
// a request made in process, which no caller check applies to. It is read
// once, where a request enters (the API handler, the typed Go method).
func callerOf(ctx context.Context) *protocol.Caller {
	if c, ok := CallerFrom(ctx); ok {
		return &c
	}
	return nil
}

// asLedger marks ctx as the ledger's own work: entries written under it
// carry no caller's CG-Actor, even when a caller's request set it off.
func asLedger(ctx context.Context) context.Context {
	return context.WithValue(ctx, callerKey{}, nil)
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
