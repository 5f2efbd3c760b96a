package protocol

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/nats-io/nats.go"
)

// Caller is who sent an API request, read from its subject
// (cgledger.v1.<project_id>.<actor>.<op>).
type Caller struct {
	Project string
	Actor   string
}

// ValidReply reports whether an API server may answer on reply: a client
// inbox (_INBOX. or a credential's _INBOX_<key>.), or the reply a
// cross-account service import made for one (_R_.).
func ValidReply(reply string) bool {
	return strings.HasPrefix(reply, "_INBOX.") || strings.HasPrefix(reply, "_INBOX_") || strings.HasPrefix(reply, "_R_.")
}

// CheckRequest lists what is wrong with a request for op on an API subject,
// as one refusal (nil when nothing is): the subject's project and actor
// tokens (a global operation's project token is GlobalProject), the reply
// subject, the header block, and the body against the subject
// (CheckCaller). It returns the caller the subject names; badReply says the
// reply subject is not an inbox, so nothing may be sent there.
func CheckRequest(op string, m *nats.Msg) (c Caller, e *Error, badReply bool) {
	return checkRequest(op, m, false)
}

// CallerAfterParse says whether op's caller check may wait for the
// operation's own parse (CheckRequestBeforeParse): dispatch and
// report.result, whose parse reads every value the check compares.
func CallerAfterParse(op string) bool { return op == OpDispatch || op == OpReportResult }

// CheckRequestBeforeParse is CheckRequest without the caller check of an
// operation that CallerAfterParse names, so that its body is decoded once:
// its handler runs the check on the values its parse found when the parse
// succeeds (CheckDispatchCaller, CheckReportResultCaller), which are the
// ones CheckCaller would read, and on the bytes (CheckCaller) when it
// fails, before refusing the request as malformed: a refusal is then
// CheckRequest's, byte for byte (CallerRefusal), and comes first.
func CheckRequestBeforeParse(op string, m *nats.Msg) (c Caller, e *Error, badReply bool) {
	return checkRequest(op, m, CallerAfterParse(op))
}

// CallerRefusal is CheckRequest's refusal of a request that contradicts
// its caller (vs, CheckCaller's violations).
func CallerRefusal(op string, vs Violations) *Error {
	return NewError(CodeForbidden, vs, "%s: %s", op, callerMismatch)
}

const callerMismatch = "request does not match the project or actor of its subject"

func checkRequest(op string, m *nats.Msg, deferCaller bool) (c Caller, e *Error, badReply bool) {
	toks := strings.SplitN(m.Subject, ".", 5)
	var vs Violations
	if len(toks) == 5 {
		c.Project, c.Actor = toks[2], toks[3]
	}
	o, _ := Op(op)
	switch {
	case o.Global && c.Project != GlobalProject:
		vs.Add("subject", VInvalidToken, "%s belongs to no project: its subject is %s", op, APISubject(GlobalProject, "<actor>", op))
	case !o.Global && !ValidIdentifier(c.Project):
		vs.Add("subject", VInvalidToken, "project token %q of %s is not an identifier", Clip(c.Project), APISubject("<project_id>", "<actor>", op))
	}
	if !ValidIdentifier(c.Actor) {
		vs.Add("subject", VInvalidToken, "actor token %q of %s is not an identifier", Clip(c.Actor), APISubject("<project_id>", "<actor>", op))
	}
	code, msg := CodeBadRequest, "invalid API subject"
	if m.Reply != "" && !ValidReply(m.Reply) {
		vs.Add("reply", VInvalidValue, "reply subject %q is not an inbox (it must start with _INBOX)", Clip(m.Reply))
		msg = "invalid reply subject"
		badReply = true
	}
	if len(vs) == 0 && op != OpDispatch && op != OpReport && op != OpReportResult {
		// Dispatch and report check their headers with the identity; the
		// others take none they read, but a bad block is refused all the same.
		vs, _ = CheckHeaders(m.Header)
		msg = "invalid request headers"
	}
	if len(vs) == 0 && !o.Global && !deferCaller {
		vs = CheckCaller(op, c, m.Header, m.Data)
		code, msg = CodeForbidden, callerMismatch
	}
	if len(vs) == 0 {
		return c, nil, badReply
	}
	return c, NewError(code, vs, "%s: %s", op, msg), badReply
}

// CheckReadRequest checks a read request on an API subject as CheckRequest
// does, for a server that answers reads (the views answer inbox.list). It
// returns the caller, or the refusal to answer with (EncodeReply).
// answer=false means there is no reply subject or it is not an inbox:
// nothing may be sent there, and a refusal is then recorded (the ledger's
// RecordRefusal), as the ledger's API server records its reads'. A refusal
// that is answered writes nothing: a read changes nothing.
func CheckReadRequest(op string, m *nats.Msg) (c Caller, answer bool, err error) {
	c, e, badReply := CheckRequest(op, m)
	if e != nil {
		return c, !badReply && m.Reply != "", e
	}
	return c, m.Reply != "", nil
}

// EncodeReply builds the body of an API reply (APIReply): res on success,
// else err. Errors that are not protocol refusals become code "internal":
// nothing was rejected, the client may retry.
func EncodeReply(res any, err error) []byte {
	var r APIReply
	if err != nil {
		e, ok := AsError(err)
		if !ok {
			e = &Error{Code: CodeInternal, Message: err.Error()}
		}
		r.Error = e
	} else {
		b, merr := json.Marshal(res)
		if merr != nil {
			r.Error = &Error{Code: CodeInternal, Message: "encode result: " + merr.Error()}
		} else {
			r.OK, r.Result = true, b
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		// Never an empty reply: say what failed in a body that always encodes.
		b, _ = json.Marshal(APIReply{Error: &Error{Code: CodeInternal, Message: "encode reply: " + ClipHead(err.Error(), MaxViolationText)}})
	}
	return b
}

// TopLevelString reads a top-level string member of a JSON object body, by
// its exact key (as the operations read them; encoding/json would match
// struct fields case-insensitively). Anything else, a malformed body
// included, reads as absent.
func TopLevelString(body []byte, key string) (string, bool) {
	return stringField(topLevel(body), key)
}

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

// CheckCaller lists where a request contradicts its caller: defence in
// depth behind NATS permissions, and the only check when running without
// them. It decodes only the top level of the body (and of a dispatch's
// card), and only for the operations whose body names a project or an
// agent. A report's actor is checked against its call's tool once the call
// is read (the ledger's), which this cannot do.
func CheckCaller(op string, c Caller, h nats.Header, body []byte) Violations {
	var vs Violations
	project := func(field, v string, ok bool) { callerProject(&vs, c, field, v, ok) }
	actor := func(field, v string, ok bool) {
		if ok && ValidIdentifier(v) && v != c.Actor {
			vs.Add(field, VForbidden, "%q is not the actor of the request subject (%q)", v, c.Actor)
		}
	}
	switch op {
	case OpCardPut:
		p, ok := stringField(topLevel(body), "project_id")
		project("card.project_id", p, ok)
	case OpDispatch:
		f := topLevel(body)
		subProject, subOK := "", false
		if s, ok := stringField(f, "subject"); ok {
			if sub, err := ParseSubject(s); err == nil {
				subProject, subOK = sub.Project, true
			}
		}
		p, ok := stringField(topLevel(f["card"]), "project_id")
		return dispatchCaller(c, subProject, subOK, p, ok, HeaderGet(h, HeaderAgentID))
	case OpReport:
		p := HeaderGet(h, HeaderProjectID)
		project("header."+HeaderProjectID, p, p != "")
	case OpReportResult:
		cp, ok := stringField(topLevel(topLevel(body)["card"]), "project_id")
		return reportResultCaller(c, HeaderGet(h, HeaderProjectID), cp, ok)
	case OpToolRegister:
		p := HeaderGet(h, HeaderProjectID)
		project("header."+HeaderProjectID, p, p != "")
		// The definition may be YAML, so only its parser finds the project
		// it names; a forbidden refusal lists every field naming another
		// project, the header's and the body's together.
		if _, err := ParseToolYAML(c.Project, body); err != nil {
			if e, ok := AsError(err); ok && e.Code == CodeForbidden {
				vs = append(vs, e.Violations...)
			}
		}
	case OpCommandReject:
		// A tool may record the refusal of its own commands only: the
		// subject it received them on names its project and, as target, itself.
		// A subject without the command shape is the body's problem
		// (bad_request, with the others), not the caller's.
		if sub, ok := stringField(topLevel(body), "subject"); ok {
			if toks, ok := CommandSubjectTokens(sub); ok && ValidIdentifier(toks[2]) && ValidIdentifier(CommandSubjectActor(toks)) && (toks[2] != c.Project || CommandSubjectActor(toks) != c.Actor) {
				vs.Add("body.subject", VForbidden, "a command of project %q for tool %q is refused on cg.<ver>.%s.<channel_id>.cmd.tool.%s[...] (or cmd.sys.pmo.internal.%s for a PMO built-in), got %q", c.Project, c.Actor, c.Project, c.Actor, c.Actor, Clip(sub))
			}
		}
	case OpConformanceCommand:
		f := topLevel(body)
		p, ok := stringField(f, "project_id")
		project("body.project_id", p, ok)
		// Only the admin's own project's tools: the command subject names it.
		if s, ok := stringField(f, "subject"); ok {
			if sub, err := ParseSubject(s); err == nil && sub.Project != c.Project {
				vs.Add("body.subject", VForbidden, "subject project %q is not the project of the request subject (%q)", Clip(sub.Project), c.Project)
			}
		}
	default: // the body names the project, and the agent of a BodyAgent op
		f := topLevel(body)
		p, ok := stringField(f, "project_id")
		project("body.project_id", p, ok)
		if o, _ := Op(op); o.BodyAgent {
			a, ok := stringField(f, "agent_id")
			actor("body.agent_id", a, ok)
		}
	}
	return vs
}

// CheckDispatchCaller is CheckCaller's check of a dispatch over the values
// its parse found (the subject's project, the card's project_id, the
// CG-Agent-ID header), for a dispatch that parsed without a violation.
func CheckDispatchCaller(c Caller, subjectProject, cardProject, agentID string) Violations {
	return dispatchCaller(c, subjectProject, true, cardProject, true, agentID)
}

// CheckReportResultCaller is CheckCaller's check of a report.result over
// the values its parse found (the CG-Project-ID header, the card's
// project_id), for a report.result that parsed without a violation.
func CheckReportResultCaller(c Caller, headerProject, cardProject string) Violations {
	return reportResultCaller(c, headerProject, cardProject, true)
}

// dispatchCaller is the dispatch case of CheckCaller: subOK and cardOK say
// the subject parsed and the card names a project_id.
func dispatchCaller(c Caller, subProject string, subOK bool, cardProject string, cardOK bool, agentID string) Violations {
	var vs Violations
	if subOK && subProject != c.Project {
		vs.Add("subject", VForbidden, "subject project %q is not the project of the request subject (%q)", Clip(subProject), c.Project)
	}
	callerProject(&vs, c, "card.project_id", cardProject, cardOK)
	if agentID != "" && ValidIdentifier(agentID) && agentID != c.Actor {
		vs.Add("header."+HeaderAgentID, VForbidden, "%q is not the actor of the request subject (%q)", agentID, c.Actor)
	}
	return vs
}

// reportResultCaller is the report.result case of CheckCaller: cardOK says
// the card names a project_id.
func reportResultCaller(c Caller, headerProject, cardProject string, cardOK bool) Violations {
	var vs Violations
	callerProject(&vs, c, "header."+HeaderProjectID, headerProject, headerProject != "")
	callerProject(&vs, c, "body.card.project_id", cardProject, cardOK)
	return vs
}

// callerProject is CheckCaller's project check: an id that is not an
// identifier is left to the operation's own validation, which names the
// precise problem.
func callerProject(vs *Violations, c Caller, field, v string, ok bool) {
	if ok && ValidIdentifier(v) && v != c.Project {
		vs.Add(field, VForbidden, "project %q is not the project of the request subject (%q)", Clip(v), c.Project)
	}
}
