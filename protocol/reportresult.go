package protocol

import (
	"github.com/nats-io/nats.go"
)

// OpReportResult takes a call's tool.result card and its report in one
// request (docs/protocol.md, "report.result"): a tool service makes one
// round trip where card.put and report make two. The ledger stores both
// together (one JetStream atomic batch) or neither.
const OpReportResult = "report.result"

// ReportResultRequest is a report.result: the report's headers and outcome
// (Report, whose Payload.ToolResultCardID is the card's id) and the
// tool.result card it names.
type ReportResultRequest struct {
	Report ReportRequest
	// Card is nil when the body's card does not read.
	Card *Card
	// Stored is the card's stored (normalized) encoding, as card.put stores it.
	Stored []byte
}

// ReportResultBody is the JSON body of a report.result request.
type ReportResultBody struct {
	Card   Card          `json:"card"`
	Report ReportPayload `json:"report"`
}

// ReportResultOutcome answers a report.result: the report's answer, and
// where the card is stored.
type ReportResultOutcome struct {
	ReportOutcome
	// CardSeq is the card's ledger sequence.
	CardSeq uint64 `json:"card_seq"`
	// CardDuplicate says the card was already stored, identical (a retry,
	// or card.put before): nothing was stored for it now.
	CardDuplicate bool `json:"card_duplicate,omitempty"`
}

// ParseReportResult validates a report.result as received over the API: the
// CG-* headers h (a report's) and the JSON body {"card": ..., "report":
// ...}. It returns the request as far as it could be read and every
// violation of both parts (paths header.*, body.card.*, body.report.*).
// Besides each part's own rules (card.put's, report's), it checks what the
// request alone can tell: the card is a tool.result card of this call and
// project, written by the reporting source (author_id = CG-Source-Id,
// function_name = CG-Source-Function), its status is the report's, and a
// tool_result_card_id given in the report is the card's id. The checks that
// need the call record (metadata copied from the tool.call card) are the
// ledger's.
func ParseReportResult(h nats.Header, data []byte) (ReportResultRequest, Violations) {
	var r ReportResultRequest
	in, id, hvs, vs := parseReportHeaders(h)
	r.Report = in
	o, ok := ParseObject("body", data, &vs, "card")
	if !ok {
		return r, vs
	}
	if raw := o.Raw("card"); raw == nil {
		vs.Add(o.Path("card"), VRequired, "is required (the tool.result card, as card.put takes it)")
	} else {
		r.Card, r.Stored = DecodeCardStored(o.Path("card"), raw, &vs)
	}
	if ro, ok := o.Object("report", true); ok {
		r.Report.Payload = parseReportPayload(ro, id, hvs, &vs, false)
	}
	c, p := r.Card, &r.Report.Payload
	if c == nil {
		return r, vs
	}
	if p.ToolResultCardID == "" {
		p.ToolResultCardID = c.CardID
	} else if c.CardID != "" && p.ToolResultCardID != c.CardID {
		vs.Add("body.report.tool_result_card_id", VMismatch, "must equal body.card.card_id (%q) when given, got %q", c.CardID, Clip(p.ToolResultCardID))
	}
	if c.Type != "" && c.Type != CardToolResult {
		vs.Add("body.card.type", VMismatch, "a report.result takes a %s card, got %q", CardToolResult, Clip(c.Type))
	}
	same := func(field, got, header, want string) {
		if got != "" && want != "" && got != want {
			vs.Add("body.card."+field, VMismatch, "must equal header %s (%q), got %q", header, want, Clip(got))
		}
	}
	same("project_id", c.ProjectID, HeaderProjectID, in.ProjectID)
	same("agent_turn_id", c.AgentTurnID, HeaderAgentTurnID, id.AgentTurnID)
	same("tool_call_id", c.ToolCallID, HeaderToolCallID, id.ToolCallID)
	same("author_id", c.AuthorID, HeaderSourceID, in.SourceID)
	same("function_name", c.FunctionName, HeaderSourceFunction, in.SourceFunction)
	if c.Type == CardToolResult && len(c.Content) > 0 && p.Status != "" {
		if tr, err := c.ToolResult(); err == nil && tr.Status != "" && tr.Status != p.Status {
			vs.Add("body.report.status", VMismatch, "report status %q differs from the result card's status %q", Clip(p.Status), Clip(tr.Status))
		}
	}
	return r, vs
}
