package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
)

// Caller is who sent an API request, read from its subject.
type Caller struct {
	Project string
	Actor   string
}

type callerKey struct{}

// WithCaller marks ctx as serving a request from c: entries written under it
// carry CG-Actor.
func WithCaller(ctx context.Context, c Caller) context.Context {
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
		ctx = WithCaller(ctx, Caller{Project: project, Actor: actor})
	}
	return run(ctx, body)
}

// CallerFrom returns the caller ctx serves, if any.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// callerOf is CallerFrom as the explicit field of a parsed request: nil for
// a request made in process, which no caller check applies to. It is read
// once, where a request enters (the API handler, the typed Go method).
func callerOf(ctx context.Context) *Caller {
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

// stringField reads a top-level string member of a JSON object, by its
// exact key (as the operations read them; encoding/json would match struct
// fields case-insensitively). Anything else reads as absent.
func stringField(obj map[string]json.RawMessage, key string) (string, bool) {
	var s string
	if r, ok := obj[key]; !ok || json.Unmarshal(r, &s) != nil {
		return "", false
	}
	return s, true
}

// topLevel decodes one level of a JSON object; a malformed body decodes to
// nothing (the operation refuses it itself, precisely).
func topLevel(b []byte) map[string]json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	obj := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		k, ok := t.(string)
		if err != nil || !ok {
			return nil
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
		if _, dup := obj[k]; dup {
			// A repeated key is the operation's own bad_request (with every
			// violation listed), whichever value comes last.
			return nil
		}
		obj[k] = v
	}
	return obj
}

// checkCaller lists where a request contradicts its caller: defence in depth
// behind NATS permissions, and the only check when running without them.
// It decodes only the top level of the body (and of a dispatch's card), and
// only for the operations whose body names a project or an agent.
func checkCaller(op string, c Caller, h nats.Header, body []byte) protocol.Violations {
	var vs protocol.Violations
	project := func(field, v string, ok bool) {
		// An id that is not an identifier is left to the operation's own
		// validation, which names the precise problem.
		if ok && protocol.ValidIdentifier(v) && v != c.Project {
			vs.Add(field, protocol.VForbidden, "project %q is not the project of the request subject (%q)", protocol.Clip(v), c.Project)
		}
	}
	actor := func(field, v string, ok bool) {
		if ok && protocol.ValidIdentifier(v) && v != c.Actor {
			vs.Add(field, protocol.VForbidden, "%q is not the actor of the request subject (%q)", v, c.Actor)
		}
	}
	switch op {
	case protocol.OpCardPut:
		p, ok := stringField(topLevel(body), "project_id")
		project("card.project_id", p, ok)
	case protocol.OpDispatch:
		f := topLevel(body)
		if s, ok := stringField(f, "subject"); ok {
			if sub, err := protocol.ParseSubject(s); err == nil && sub.Project != c.Project {
				vs.Add("subject", protocol.VForbidden, "subject project %q is not the project of the request subject (%q)", protocol.Clip(sub.Project), c.Project)
			}
		}
		p, ok := stringField(topLevel(f["card"]), "project_id")
		project("card.project_id", p, ok)
		a := protocol.HeaderGet(h, protocol.HeaderAgentID)
		actor("header."+protocol.HeaderAgentID, a, a != "")
	case protocol.OpReport:
		// A report's actor is checked against its call's tool once the call
		// is read (callerOwnsCall).
		p := protocol.HeaderGet(h, protocol.HeaderProjectID)
		project("header."+protocol.HeaderProjectID, p, p != "")
	case protocol.OpToolRegister:
		p := protocol.HeaderGet(h, protocol.HeaderProjectID)
		project("header."+protocol.HeaderProjectID, p, p != "")
		// The definition may be YAML, so only its parser finds the project
		// it names; a forbidden refusal lists every field naming another
		// project, the header's and the body's together.
		if _, err := protocol.ParseToolYAML(c.Project, body); err != nil {
			if e, ok := protocol.AsError(err); ok && e.Code == protocol.CodeForbidden {
				vs = append(vs, e.Violations...)
			}
		}
	case protocol.OpRosterSet, protocol.OpConsume, protocol.OpCancel, protocol.OpInboxList, protocol.OpCommit, protocol.OpAbort:
		f := topLevel(body)
		p, ok := stringField(f, "project_id")
		project("body.project_id", p, ok)
		a, ok := stringField(f, "agent_id")
		actor("body.agent_id", a, ok)
	case protocol.OpCommandReject:
		// A tool may record the refusal of its own commands only: the
		// subject it received them on names its project and, as target, itself.
		// A subject without the command shape is the body's problem
		// (bad_request, with the others), not the caller's.
		if sub, ok := stringField(topLevel(body), "subject"); ok {
			if toks, ok := protocol.CommandSubjectTokens(sub); ok && protocol.ValidIdentifier(toks[2]) && protocol.ValidIdentifier(protocol.CommandSubjectActor(toks)) && (toks[2] != c.Project || protocol.CommandSubjectActor(toks) != c.Actor) {
				vs.Add("body.subject", protocol.VForbidden, "a command of project %q for tool %q is refused on cg.<ver>.%s.<channel_id>.cmd.tool.%s[...] (or cmd.sys.pmo.internal.%s for a PMO built-in), got %q", c.Project, c.Actor, c.Project, c.Actor, c.Actor, protocol.Clip(sub))
			}
		}
	case protocol.OpConformanceCommand:
		f := topLevel(body)
		p, ok := stringField(f, "project_id")
		project("body.project_id", p, ok)
		// Only the admin's own project's tools: the command subject names it.
		if s, ok := stringField(f, "subject"); ok {
			if sub, err := protocol.ParseSubject(s); err == nil && sub.Project != c.Project {
				vs.Add("body.subject", protocol.VForbidden, "subject project %q is not the project of the request subject (%q)", protocol.Clip(sub.Project), c.Project)
			}
		}
	default: // reads, and report.resume
		p, ok := stringField(topLevel(body), "project_id")
		project("body.project_id", p, ok)
	}
	return vs
}

// callerOwnsCall checks that a report comes from the tool its call was
// dispatched to: the actor of a report is the command subject's tool target
// (or PMO tool). c is the caller the request was parsed with at its edge;
// reports made in process (nil) are not checked.
func callerOwnsCall(c *Caller, rec *protocol.CallRecord) protocol.Violations {
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
