package ledger

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go"
)

// HeaderActor names, on an entry written for an API request, the actor token
// of the request's subject (cgledger.v1.<project>.<actor>.<op>): the agent,
// tool or person NATS let publish it. It records who asked.
const HeaderActor = "CG-Actor"

// CodeForbidden: the request names a project or an actor other than the one
// its API subject (which NATS permissions scope) grants.
const CodeForbidden Code = "forbidden"

// ErrForbidden matches every *Error with code forbidden.
var ErrForbidden = errors.New("forbidden")

func init() { sentinelByCode[CodeForbidden] = ErrForbidden }

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

// CallerFrom returns the caller ctx serves, if any.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

func asString(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

// checkCaller lists where a request contradicts its caller: defence in depth
// behind NATS permissions, and the only check when running without them.
func checkCaller(op string, c Caller, h nats.Header, body []byte) Violations {
	var vs Violations
	// Exact keys, as the operations read them (encoding/json would match
	// struct fields case-insensitively). Malformed bodies are refused by the
	// operation itself.
	var f map[string]any
	_ = json.Unmarshal(body, &f)
	card, _ := f["card"].(map[string]any)
	project := func(field string, v any) {
		// An id that is not an identifier is left to the operation's own
		// validation, which names the precise problem.
		if s, ok := asString(v); ok && ValidIdentifier(s) && s != c.Project {
			vs.Add(field, VForbidden, "project %q is not the project of the request subject (%q)", clip(s), c.Project)
		}
	}
	actor := func(field string, v any) {
		if a, ok := asString(v); ok && ValidIdentifier(a) && a != c.Actor {
			vs.Add(field, VForbidden, "%q is not the actor of the request subject (%q)", a, c.Actor)
		}
	}
	switch op {
	case OpCardPut:
		project("card.project_id", f["project_id"])
	case OpDispatch:
		if s, ok := asString(f["subject"]); ok {
			if sub, err := ParseSubject(s); err == nil && sub.Project != c.Project {
				vs.Add("body.subject", VForbidden, "subject project %q is not the project of the request subject (%q)", clip(sub.Project), c.Project)
			}
		}
		if card != nil {
			project("card.project_id", card["project_id"])
		}
		if a := HeaderGet(h, HeaderAgentID); a != "" {
			actor("header."+HeaderAgentID, a)
		}
	case OpReport, OpToolRegister:
		// A report's actor is checked against its call's tool once the call
		// is read (callerOwnsCall).
		if p := HeaderGet(h, HeaderProjectID); p != "" {
			project("header."+HeaderProjectID, p)
		}
	case OpRosterSet, OpConsume, OpCancel:
		project("body.project_id", f["project_id"])
		actor("body.agent_id", f["agent_id"])
	default: // reads
		project("body.project_id", f["project_id"])
	}
	return vs
}

// callerOwnsCall checks that a report comes from the tool its call was
// dispatched to: the actor of a report is the command subject's tool target
// (or PMO tool). Reports made in process (no caller) are not checked.
func callerOwnsCall(ctx context.Context, rec *CallRecord) Violations {
	c, ok := CallerFrom(ctx)
	if !ok {
		return nil
	}
	sub, err := ParseSubject(rec.Subject)
	if err != nil {
		return nil
	}
	tool := sub.Tool
	if sub.Kind == SubjectToolCommand && len(sub.Target) > 0 {
		tool = sub.Target[0]
	}
	var vs Violations
	if tool != c.Actor {
		vs.Add("subject", VForbidden, "call %s was dispatched to tool %q; the report's actor is %q", rec.ToolCallID, tool, c.Actor)
	}
	return vs
}
