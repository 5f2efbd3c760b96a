package protocol

import (
	"strings"

	"github.com/nats-io/nats.go"
)

// ParseReport validates a report as received over the API: the CG-* headers
// h and the JSON payload data. It returns the request as far as it could be
// read, and every violation found; a report is valid only when there are
// none. The call's step is the header's CG-Step-Id, or else the payload's
// step_id.
func ParseReport(h nats.Header, data []byte) (ReportRequest, Violations) {
	in, id, hvs, vs := parseReportHeaders(h)
	o, ok := ParseObject("payload", data, &vs)
	if !ok {
		return in, vs
	}
	in.Payload = parseReportPayload(o, id, hvs, &vs, true)
	return in, vs
}

// parseReportHeaders reads the CG-* headers of a report (and of a
// report.result): the request without its payload, the identity, the
// identity's own violations and every violation of the headers.
func parseReportHeaders(h nats.Header) (in ReportRequest, id Identity, hvs, vs Violations) {
	id, vs, bad := ParseIdentityHeaders(h, IdentityRules{RequireToolCallID: true})
	hvs = append(Violations(nil), vs...)
	hdr := func(name string) string {
		if bad[strings.ToLower(name)] {
			return ""
		}
		v, ok := HeaderValue(h, name)
		switch {
		case !ok:
			vs.Add("header."+name, VRequired, "header is required")
		case v == "":
			vs.Add("header."+name, VEmpty, "header must not be empty")
		}
		return v
	}
	in.ProjectID = hdr(HeaderProjectID)
	if in.ProjectID != "" {
		CheckIdent(&vs, "header."+HeaderProjectID, in.ProjectID, true)
	}
	in.ChannelID = hdr(HeaderChannelID)
	if in.ChannelID != "" {
		CheckIdent(&vs, "header."+HeaderChannelID, in.ChannelID, true)
	}
	in.Identity = id
	in.SourceID = hdr(HeaderSourceID)
	if in.SourceID != "" {
		CheckName(&vs, "header."+HeaderSourceID, in.SourceID, true)
	}
	in.SourceFunction = hdr(HeaderSourceFunction)
	if in.SourceFunction != "" {
		CheckName(&vs, "header."+HeaderSourceFunction, in.SourceFunction, true)
	}
	return in, id, hvs, vs
}

// parseReportPayload reads a report's outcome from o (a report's payload,
// or the report member of a report.result, whose tool_result_card_id is
// optional: cardIDRequired false).
func parseReportPayload(o JSONObject, id Identity, hvs Violations, vs *Violations, cardIDRequired bool) ReportPayload {
	for _, f := range InlineForbidden {
		if o.Has(f) {
			vs.Add(o.Path(f), VForbidden, "inline %s are not allowed in a report: write it to the tool.result card", f)
		}
	}
	p := ReportPayload{
		Status:           o.Str("status", true),
		AfterExecution:   o.Str("after_execution", true),
		ToolResultCardID: o.Ident("tool_result_card_id", cardIDRequired),
		StepID:           o.Ident("step_id", false),
		AttemptOutcome:   o.Str("attempt_outcome", false),
	}
	if p.AttemptOutcome != "" && !ValidAttemptOutcome(p.AttemptOutcome) {
		vs.Add(o.Path("attempt_outcome"), VInvalidValue, "must be %q or %q when present, got %q", AttemptReconciled, AttemptOutcomeUnknown, Clip(p.AttemptOutcome))
	}
	if p.AttemptOutcome == AttemptOutcomeUnknown && p.Status != "" && p.Status != StatusFailed {
		vs.Add(o.Path("attempt_outcome"), VMismatch, "%q needs status %q, got %q", AttemptOutcomeUnknown, StatusFailed, Clip(p.Status))
	}
	if p.Status != "" && !ValidStatus(p.Status) {
		vs.Add(o.Path("status"), VInvalidValue, "must be one of success, failed, canceled, timeout, partial; got %q", Clip(p.Status))
	}
	if p.AfterExecution != "" && !ValidAfterExecution(p.AfterExecution) {
		vs.Add(o.Path("after_execution"), VInvalidValue, "must be %q or %q, got %q", AfterSuspend, AfterTerminate, Clip(p.AfterExecution))
	}
	CheckPayloadIdentity(o, id, hvs, vs)
	return p
}
