package protocol

import (
	"encoding/json"
	"fmt"
	"time"
)

// Card types this ledger stores.
const (
	CardToolCall   = "tool.call"
	CardToolResult = "tool.result"
)

// Result statuses (L0).
const (
	StatusSuccess  = "success"
	StatusFailed   = "failed"
	StatusCanceled = "canceled"
	StatusTimeout  = "timeout"
	StatusPartial  = "partial"
)

// ValidStatus reports whether s is one of the five L0 statuses.
func ValidStatus(s string) bool {
	switch s {
	case StatusSuccess, StatusFailed, StatusCanceled, StatusTimeout, StatusPartial:
		return true
	}
	return false
}

// CardMetadata is the lineage a tool.result card copies verbatim from its
// tool.call card.
type CardMetadata struct {
	TraceID      string `json:"trace_id"`
	ParentStepID string `json:"parent_step_id"`
	StepID       string `json:"step_id"`
}

// ToolCallContent is the content of a tool.call card.
type ToolCallContent struct {
	ToolName  string          `json:"tool_name"`
	Arguments json.RawMessage `json:"arguments"`
}

// ToolError is the error of a tool.result card.
type ToolError struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Detail  json.RawMessage `json:"detail,omitempty"`
}

// Recommended error codes of a tool.result card (its error.code, repeated
// by convention as result.error_code): the set docs/protocol.md lists.
// Tools may use others; metrics count those under one label.
const (
	ErrorCodeToolTimeout         = "tool_timeout"
	ErrorCodeAuthFailed          = "auth_failed"
	ErrorCodeBadRequest          = "bad_request"
	ErrorCodeUpstreamUnavailable = "upstream_unavailable"
	ErrorCodeInternal            = "internal_error"
	// ErrorCodeCanceled goes with status canceled.
	ErrorCodeCanceled = "canceled"
)

// RecommendedErrorCodes lists the recommended error codes, in the order
// docs/protocol.md gives them.
func RecommendedErrorCodes() []string {
	return []string{ErrorCodeToolTimeout, ErrorCodeAuthFailed, ErrorCodeBadRequest, ErrorCodeUpstreamUnavailable, ErrorCodeInternal, ErrorCodeCanceled}
}

// RecommendedErrorCode reports whether code is one of the recommended
// error codes.
func RecommendedErrorCode(code string) bool {
	switch code {
	case ErrorCodeToolTimeout, ErrorCodeAuthFailed, ErrorCodeBadRequest, ErrorCodeUpstreamUnavailable, ErrorCodeInternal, ErrorCodeCanceled:
		return true
	}
	return false
}

// ErrorCode is the content's error.code, or "" when it has no error (a
// valid card's error.code is never empty).
func (tr ToolResultContent) ErrorCode() string {
	if tr.Error == nil {
		return ""
	}
	return tr.Error.Code
}

// ToolResultContent is the content of a tool.result card.
type ToolResultContent struct {
	Status string          `json:"status"`
	Result json.RawMessage `json:"result"`
	Error  *ToolError      `json:"error,omitempty"`
}

// Card is a tool.call or tool.result card. Content holds the normalized JSON
// of a ToolCallContent or ToolResultContent (by Type).
type Card struct {
	CardID       string          `json:"card_id"`
	ProjectID    string          `json:"project_id"`
	Type         string          `json:"type"`
	AuthorID     string          `json:"author_id"`
	FunctionName string          `json:"function_name,omitempty"`
	AgentTurnID  string          `json:"agent_turn_id"`
	ToolCallID   string          `json:"tool_call_id"`
	Content      json.RawMessage `json:"content"`
	Metadata     CardMetadata    `json:"metadata"`
}

// StoredCard is a card as stored in the ledger: the card plus the sequence
// and time of the entry that wrote it.
type StoredCard struct {
	Card Card      `json:"card"`
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
}

// ToolCall decodes the content of a tool.call card.
func (c *Card) ToolCall() (ToolCallContent, error) {
	var tc ToolCallContent
	if c.Type != CardToolCall {
		return tc, fmt.Errorf("card %s is %q, not %s", c.CardID, c.Type, CardToolCall)
	}
	if err := json.Unmarshal(c.Content, &tc); err != nil {
		return tc, fmt.Errorf("decode tool.call content of card %s: %w", c.CardID, err)
	}
	return tc, nil
}

// ToolResult decodes the content of a tool.result card.
func (c *Card) ToolResult() (ToolResultContent, error) {
	var tr ToolResultContent
	if c.Type != CardToolResult {
		return tr, fmt.Errorf("card %s is %q, not %s", c.CardID, c.Type, CardToolResult)
	}
	if err := json.Unmarshal(c.Content, &tr); err != nil {
		return tr, fmt.Errorf("decode tool.result content of card %s: %w", c.CardID, err)
	}
	return tr, nil
}

// EffectiveAfterExecution returns result.__cg_control.after_execution when it
// is present and valid, else fallback (the report's own field).
func (tr ToolResultContent) EffectiveAfterExecution(fallback string) string {
	var r struct {
		Control *struct {
			AfterExecution string `json:"after_execution"`
		} `json:"__cg_control"`
	}
	if len(tr.Result) > 0 && tr.Result[0] == '{' && json.Unmarshal(tr.Result, &r) == nil &&
		r.Control != nil && ValidAfterExecution(r.Control.AfterExecution) {
		return r.Control.AfterExecution
	}
	return fallback
}

// ParseCard validates a card and returns it with normalized content. Every
// violation is returned at once as a bad_request *Error. Unknown fields are
// dropped; arbitrary dicts or text as content are rejected.
func ParseCard(data []byte) (*Card, error) {
	var vs Violations
	c := DecodeCard("card", data, &vs)
	if err := BadRequest("card", vs); err != nil {
		return nil, err
	}
	return c, nil
}

// DecodeCard is ParseCard for a card inside a larger request: it reads data
// as the card at field path prefix and adds every violation to vs. The card
// is nil when data is not a JSON object.
func DecodeCard(prefix string, data []byte, vs *Violations) *Card {
	c, _ := DecodeCardStored(prefix, data, vs)
	return c
}

// DecodeCardStored is DecodeCard that also returns the card's stored form
// (its JSON encoding, which the size check computes anyway), so a writer
// need not encode the card again; nil with the card.
func DecodeCardStored(prefix string, data []byte, vs *Violations) (*Card, []byte) {
	o, ok := ParseObject(prefix, data, vs)
	if !ok {
		return nil, nil
	}
	c := &Card{CardID: o.Ident("card_id", true), ProjectID: o.Ident("project_id", true), Type: o.Str("type", true)}
	c.AuthorID = o.Name("author_id", true)
	c.FunctionName = o.Name("function_name", c.Type == CardToolResult)
	c.AgentTurnID = o.Ident("agent_turn_id", true)
	c.ToolCallID = o.Ident("tool_call_id", true)
	if md, ok := o.Object("metadata", false); ok {
		c.Metadata = CardMetadata{
			TraceID:      md.Str("trace_id", false),
			ParentStepID: md.Str("parent_step_id", false),
			StepID:       md.Str("step_id", false),
		}
	}
	var content any
	switch c.Type {
	case "":
	case CardToolCall:
		if tc, ok := parseToolCallContent(o, vs); ok {
			content = tc
		}
	case CardToolResult:
		if tr, ok := parseToolResultContent(o, vs); ok {
			content = tr
		}
	default:
		vs.Add(o.Path("type"), VInvalidValue, "must be %q or %q, got %q", CardToolCall, CardToolResult, Clip(c.Type))
	}
	if content != nil {
		b, err := json.Marshal(content)
		if err != nil {
			vs.Add(o.Path("content"), VInvalidJSON, "cannot be encoded: %v", err)
		}
		c.Content = b
	}
	// The limit applies to the stored form, which can be larger than what
	// was sent (Go escapes <, > and & in JSON strings as \u003c...).
	b, err := json.Marshal(c)
	if err != nil {
		return c, nil
	}
	if len(b) > MaxCardBytes {
		vs.Add(prefix, VTooLarge, "card is %d bytes when normalized; the limit is %d", len(b), MaxCardBytes)
	}
	return c, b
}

func contentObject(o JSONObject, vs *Violations, kind string) (JSONObject, bool) {
	r := o.Raw("content")
	if r == nil {
		vs.Add(o.Path("content"), VRequired, "is required (%s)", kind)
		return JSONObject{}, false
	}
	if r[0] != '{' {
		vs.Add(o.Path("content"), VInvalidType, "must be a %s object; text or other JSON is not accepted", kind)
		return JSONObject{}, false
	}
	return parseMember(o.Path("content"), r, vs)
}

func parseToolCallContent(o JSONObject, vs *Violations) (ToolCallContent, bool) {
	var tc ToolCallContent
	co, ok := contentObject(o, vs, "ToolCallContent")
	if !ok {
		return tc, false
	}
	n := len(*vs)
	tc.ToolName = co.Name("tool_name", true)
	args := co.Raw("arguments")
	switch {
	case args == nil:
		vs.Add(co.Path("arguments"), VRequired, "is required (a JSON object, {} for none)")
	case args[0] != '{':
		vs.Add(co.Path("arguments"), VInvalidType, "must be a JSON object")
	default:
		tc.Arguments = CompactJSON(args)
	}
	return tc, len(*vs) == n
}

func parseToolResultContent(o JSONObject, vs *Violations) (ToolResultContent, bool) {
	var tr ToolResultContent
	co, ok := contentObject(o, vs, "ToolResultContent")
	if !ok {
		return tr, false
	}
	n := len(*vs)
	tr.Status = co.Str("status", true)
	if tr.Status != "" && !ValidStatus(tr.Status) {
		vs.Add(co.Path("status"), VInvalidValue, "must be one of success, failed, canceled, timeout, partial; got %q", Clip(tr.Status))
	}
	tr.Result = CompactJSON(co.Raw("result"))
	if eo, ok := co.Object("error", false); ok {
		tr.Error = &ToolError{Code: eo.Str("code", true), Message: eo.Str("message", false)}
		if d := eo.Raw("detail"); d != nil {
			if d[0] != '{' {
				vs.Add(eo.Path("detail"), VInvalidType, "must be a JSON object")
			} else {
				tr.Error.Detail = CompactJSON(d)
			}
		}
	}
	switch {
	case tr.Status == StatusSuccess && tr.Error != nil:
		vs.Add(co.Path("error"), VForbidden, "must be absent or null when status is success")
	case (tr.Status == StatusFailed || tr.Status == StatusTimeout) && tr.Error == nil && co.Raw("error") == nil:
		vs.Add(co.Path("error"), VRequired, "is required when status is %s", tr.Status)
	}
	return tr, len(*vs) == n
}

// CardPut is a card.put request as read.
type CardPut struct {
	// Card is nil when the card does not read; Stored is its stored
	// encoding.
	Card   *Card
	Stored []byte
	// ProjectID is the project the body names, read only for a refusal
	// (a card that does not read may still name one): the refusal is the
	// project's.
	ProjectID string
}

// ParseCardPut reads a card.put body, the card, listing every violation:
// the card's, and a tool.call card under the ids of a redrive's derived
// call, which only the ledger writes.
func ParseCardPut(body []byte) (CardPut, Violations) {
	var vs Violations
	c, stored := DecodeCardStored("card", body, &vs)
	if c != nil && c.Type == CardToolCall {
		// The ids of a redrive's derived call: a tool.call card under them
		// put by anyone but the redrive would take the derived call's card
		// id, or name a call only the ledger may create. A tool.result
		// card answers the derived call under its id, and stays allowed.
		for _, f := range []struct{ field, id string }{{"card.card_id", c.CardID}, {"card.tool_call_id", c.ToolCallID}} {
			if ReservedCallID(f.id) {
				vs.Add(f.field, VInvalidToken, "%q ends in %s followed by a number, which is reserved for the derived calls of call.redrive (only the ledger writes their tool.call cards)", f.id, RedriveSeparator)
			}
		}
	}
	r := CardPut{Card: c, Stored: stored}
	if len(vs) > 0 {
		var probe struct {
			ProjectID string `json:"project_id"`
		}
		if json.Unmarshal(body, &probe) == nil {
			r.ProjectID = probe.ProjectID
		}
	}
	return r, vs
}
