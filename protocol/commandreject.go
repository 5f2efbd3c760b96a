package protocol

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// MaxRejectionViolations bounds the violations a command.reject request may
// carry: an executor lists every problem of one command, and a refused
// command is at most MaxRequestBytes.
const MaxRejectionViolations = 256

// KnownCode reports whether c is one of the protocol's error codes.
func KnownCode(c Code) bool {
	_, ok := sentinelByCode[c]
	return ok || c == CodeInternal
}

// ParseCommandRejection validates a command.reject body. It returns the
// request as far as it could be read and every violation found. The
// refusal's code must be a protocol code and its message is required;
// violations carry the limits of Violations.Add.
func ParseCommandRejection(data []byte) (CommandRejection, Violations) {
	var r CommandRejection
	var vs Violations
	o, ok := ParseObject("body", data, &vs)
	if !ok {
		return r, vs
	}
	r.Subject = o.Str("subject", true)
	if toks, ok := CommandSubjectTokens(r.Subject); r.Subject != "" && !ok {
		vs.Add(o.Path("subject"), VInvalidSubject, "must be the subject a tool command was received on, %s.<ver>.<project_id>.<channel_id>.cmd.tool.<target>[...]: tokens neither empty nor wildcards, no whitespace; got %q", Root, Clip(r.Subject))
	} else if ok {
		// A tool receives only its own project's commands for its own
		// target, both identifiers; a token that is not one names nobody,
		// so it is this body's problem rather than a forbidden request
		// (the same rule as every project id a request names).
		if !ValidIdentifier(toks[2]) {
			vs.Add(o.Path("subject"), VInvalidToken, "project token %q is not an identifier", Clip(toks[2]))
		}
		if !ValidIdentifier(toks[6]) {
			vs.Add(o.Path("subject"), VInvalidToken, "tool target token %q is not an identifier", Clip(toks[6]))
		}
	}
	if raw := o.Raw("headers"); raw != nil {
		if err := json.Unmarshal(raw, &r.Headers); err != nil {
			vs.Add(o.Path("headers"), VInvalidType, "must map header names to arrays of strings")
		}
		names := make([]string, 0, len(r.Headers))
		for name := range r.Headers {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			if !validHeaderName(name) {
				vs.Add(o.Path("headers"), VInvalidValue, "%q is not a header name: printable ASCII without ':' or spaces", Clip(name))
			}
			for _, v := range r.Headers[name] {
				if strings.ContainsAny(v, "\r\n") {
					vs.Add(o.Path("headers"), VInvalidValue, "a value of %q holds a line break, which no header value can", Clip(name))
					break
				}
			}
		}
	}
	if raw := o.Raw("data"); raw != nil {
		if err := json.Unmarshal(raw, &r.Data); err != nil {
			vs.Add(o.Path("data"), VInvalidType, "must be the command's body in standard base64 (padded)")
		}
	}
	eo, ok := o.Object("error", true)
	if !ok {
		return r, vs
	}
	e := &Error{Code: Code(eo.Str("code", true)), Message: eo.Str("message", true)}
	switch {
	case e.Code == "":
	case !KnownCode(e.Code):
		vs.Add(eo.Path("code"), VInvalidValue, "is not an error code of the protocol: %q", Clip(string(e.Code)))
	case e.Code == CodeInternal:
		vs.Add(eo.Path("code"), VInvalidValue, "internal is not a refusal: a command the service could not handle stays unacknowledged")
	}
	if len(e.Message) > MaxViolationText {
		vs.Add(eo.Path("message"), VTooLarge, "is %d bytes; the limit is %d", len(e.Message), MaxViolationText)
	}
	if raw := eo.Raw("violations"); raw != nil {
		if err := json.Unmarshal(raw, &e.Violations); err != nil {
			vs.Add(eo.Path("violations"), VInvalidType, `must be an array of {"field","code","message"}`)
		}
	}
	if len(e.Violations) > MaxRejectionViolations {
		vs.Add(eo.Path("violations"), VTooLarge, "has %d violations; the limit is %d", len(e.Violations), MaxRejectionViolations)
	}
	for i, v := range e.Violations {
		at := fmt.Sprintf("%s[%d]", eo.Path("violations"), i)
		if v.Code == "" {
			vs.Add(at+".code", VRequired, "is required")
		}
		for _, f := range [...]struct{ name, s string }{{"field", v.Field}, {"code", v.Code}, {"message", v.Message}} {
			if len(f.s) > MaxViolationText {
				vs.Add(at+"."+f.name, VTooLarge, "is %d bytes; the limit is %d", len(f.s), MaxViolationText)
			}
		}
	}
	r.Error = e
	return r, vs
}

// CommandSubjectTokens splits a tool command subject,
// cg.<ver>.<project>.<channel>.cmd.tool.<target>[...], into its tokens; ok
// is false unless it has that shape with a valid version and no empty,
// wildcard or whitespace token (no NATS message arrives on such a subject).
// The project, channel and target tokens are not checked as identifiers: a
// refused command may name ones the ledger would never accept.
func CommandSubjectTokens(s string) ([]string, bool) {
	toks := strings.Split(s, ".")
	if len(toks) < 7 || toks[0] != Root || !ValidVersion(toks[1]) || toks[4] != "cmd" || toks[5] != "tool" {
		return nil, false
	}
	for _, t := range toks {
		if t == "" || t == "*" || t == ">" || strings.ContainsAny(t, " \t\r\n") {
			return nil, false
		}
	}
	return toks, true
}

// validHeaderName reports whether s can be a NATS header name: printable
// ASCII without ':' or spaces.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == ':' {
			return false
		}
	}
	return true
}
