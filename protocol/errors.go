package protocol

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Code is a stable, machine-readable protocol error code. Codes appear in API
// error replies and in rejection entries; docs/protocol.md lists them.
type Code string

// Protocol error codes.
const (
	// CodeBadRequest: the request is malformed; Violations lists every problem.
	CodeBadRequest Code = "bad_request"
	// CodeUnknownCall: no call was dispatched through the ledger for
	// (project_id, agent_turn_id, tool_call_id).
	CodeUnknownCall Code = "unknown_call"
	// CodeUnknownCard: a referenced card id does not exist in the project.
	CodeUnknownCard Code = "unknown_card"
	// CodeMismatch: the report or dispatch does not match what is stored
	// (wrong author, function name, call, channel, metadata, status...).
	CodeMismatch Code = "mismatch"
	// CodeStaleEpoch: turn_epoch is not the epoch the call was dispatched with.
	CodeStaleEpoch Code = "stale_epoch"
	// CodeConflict: a different result (or dispatch, or card) already exists
	// for the same identity.
	CodeConflict Code = "conflict"
	// CodeNotFound: a read found nothing (roster entry, call record).
	CodeNotFound Code = "not_found"
	// CodeNotReported: the call has no accepted report yet, so there is
	// nothing to consume.
	CodeNotReported Code = "not_reported"
	// CodeInternal: the ledger could not complete the operation (NATS
	// unavailable, timeout). Nothing was rejected; retry the same request.
	CodeInternal Code = "internal"
)

// Sentinel errors for conditions callers branch on. Every *Error matches the
// sentinel of its code with errors.Is.
var (
	ErrBadRequest  = errors.New("bad request")
	ErrUnknownCall = errors.New("unknown call")
	ErrUnknownCard = errors.New("unknown card")
	ErrMismatch    = errors.New("mismatch")
	ErrStaleEpoch  = errors.New("stale epoch")
	ErrConflict    = errors.New("conflict")
	ErrNotFound    = errors.New("not found")
	ErrNotReported = errors.New("not reported")
)

var sentinelByCode = map[Code]error{
	CodeBadRequest:  ErrBadRequest,
	CodeUnknownCall: ErrUnknownCall,
	CodeUnknownCard: ErrUnknownCard,
	CodeMismatch:    ErrMismatch,
	CodeStaleEpoch:  ErrStaleEpoch,
	CodeConflict:    ErrConflict,
	CodeNotFound:    ErrNotFound,
	CodeNotReported: ErrNotReported,
}

// Violation is one problem with a request: where (a field path such as
// "header.CG-Turn-Epoch" or "payload.after_execution"), what (a stable code),
// and a human message.
type Violation struct {
	Field   string `json:"field"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Violation codes. Stable; listed in docs/protocol.md.
const (
	VRequired         = "required"
	VEmpty            = "empty"
	VInvalidType      = "invalid_type"
	VInvalidToken     = "invalid_token"
	VInvalidValue     = "invalid_value"
	VInvalidJSON      = "invalid_json"
	VForbidden        = "forbidden"
	VIdentityMismatch = "identity_mismatch"
	VMismatch         = "mismatch"
	VTooLarge         = "too_large"
	VInvalidSubject   = "invalid_subject"
	VConflict         = "conflict"
	VNotFound         = "not_found"
	// VInvalidUTF8: a body, a header name or a header value holds bytes that
	// are not UTF-8. JSON text must be UTF-8 (RFC 8259), and the ledger never
	// stores what strict parsers elsewhere would reject.
	VInvalidUTF8 = "invalid_utf8"
	// VDuplicate: a JSON object repeats a key, or a request repeats a CG-*
	// (or traceparent) header. Decoders disagree on which copy wins, so the
	// ledger refuses rather than pick one.
	VDuplicate = "duplicate"
	// VLate: a report arrived after its call's deadline, which the ledger
	// recorded as the call's timeout; the report is refused (conflict).
	VLate = "late"
	// VNotServed: an HTTP route of a role this serve process does not run
	// (serve --roles): another process may serve it. Not "nothing found".
	VNotServed = "not_served"
)

// Violations collects violations in the order they are found.
type Violations []Violation

// Add appends a violation.
//
// Fields and messages are cut to MaxViolationText bytes (keeping the end of
// a field path, which names the offending key): a request can make paths as
// long as itself, and the refusal must still fit in one reply and one
// rejection entry.
func (vs *Violations) Add(field, code, format string, args ...any) {
	*vs = append(*vs, Violation{Field: clipTail(field, MaxViolationText), Code: code, Message: ClipHead(fmt.Sprintf(format, args...), MaxViolationText)})
}

// MaxViolationText bounds a violation's field and message, in bytes.
const MaxViolationText = 512

// clipTail keeps the last n bytes of s (on a UTF-8 boundary), marked with
// a leading "...".
func clipTail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n + 3
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return "..." + s[i:]
}

// ClipHead keeps the first n bytes of s (on a UTF-8 boundary), marked with
// a trailing "...".
func ClipHead(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - 3
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

// Error is the typed error of every ledger operation that is refused. It
// carries the protocol code, a message, and every violation found.
type Error struct {
	Code       Code        `json:"code"`
	Message    string      `json:"message"`
	Violations []Violation `json:"violations,omitempty"`
	// Seq is the ledger sequence of the rejection entry that records this
	// refusal, when one was written.
	Seq uint64 `json:"rejection_seq,omitempty"`
}

// Error implements error.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(string(e.Code))
	b.WriteString(": ")
	b.WriteString(e.Message)
	for i, v := range e.Violations {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s (%s)", v.Field, v.Message, v.Code)
	}
	return b.String()
}

// Unwrap lets errors.Is match the sentinel for the error's code.
func (e *Error) Unwrap() error { return sentinelByCode[e.Code] }

// NewError builds an *Error.
func NewError(code Code, vs []Violation, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Violations: vs}
}

// BadRequest returns nil when vs is empty, else a bad_request *Error.
func BadRequest(what string, vs Violations) error {
	if len(vs) == 0 {
		return nil
	}
	return NewError(CodeBadRequest, vs, "invalid %s: %d violation(s)", what, len(vs))
}

// AsError returns the *Error in err's chain, if any.
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}
