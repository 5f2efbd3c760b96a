// Package executor is cgledger's tool runtime: durable pull consumers on the
// command subjects, validation, arguments from the tool.call card and the
// tool registry, deadlines, retries with backoff and jitter, heartbeats,
// cancellation, result cards and reports, per-tool concurrency limits and a
// graceful drain. Tool implementers write a Tool; the executor does the
// rest of the protocol.
package executor

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// OutcomeKind is one of seed 004's four outcomes (plus the L0 partial).
type OutcomeKind string

// Outcome kinds.
const (
	KindSuccess   OutcomeKind = "success"
	KindPartial   OutcomeKind = "partial"
	KindRetryable OutcomeKind = "retryable_error"
	KindTerminal  OutcomeKind = "terminal_error"
	KindInvalid   OutcomeKind = "invalid_request"
)

// Outcome is what a tool returns for one attempt.
type Outcome struct {
	Kind OutcomeKind
	// Output is the typed result on success (and partial success).
	Output any
	// Code is the error taxonomy code (seed 004 section 5), e.g. R-UPSTREAM-503.
	Code    string
	Message string
	// Hint is the corrective action for terminal errors.
	Hint string
	// RetryAfter is the upstream's backoff hint for retryable errors.
	RetryAfter time.Duration
	// Violations lists every problem of an invalid request.
	Violations []protocol.Violation

	// progress is the call's recorded progress (Call.Progress), written in
	// a non-success result's error.detail.progress.
	progress []Progress
}

// Success is a successful outcome with typed output.
func Success(output any) Outcome { return Outcome{Kind: KindSuccess, Output: output} }

// Partial is a partially successful outcome (L0 status partial).
func Partial(output any, code, message string) Outcome {
	return Outcome{Kind: KindPartial, Output: output, Code: code, Message: message}
}

// Retryable is a transient failure worth retrying after retryAfter (zero
// means the policy's backoff).
func Retryable(code, message string, retryAfter time.Duration) Outcome {
	return Outcome{Kind: KindRetryable, Code: code, Message: message, RetryAfter: retryAfter}
}

// Terminal is a failure that retrying will not fix; hint says what will.
func Terminal(code, message, hint string) Outcome {
	return Outcome{Kind: KindTerminal, Code: code, Message: message, Hint: hint}
}

// Invalid is a request the tool refuses, with every violation.
func Invalid(message string, violations ...protocol.Violation) Outcome {
	return Outcome{Kind: KindInvalid, Code: "I-REQ-001", Message: message, Violations: violations}
}

// Taxonomy codes the executor itself produces.
const (
	CodeTimeout       = "R-TIMEOUT-001"
	CodeInvalidArgs   = "I-REQ-001"
	CodeBadCommand    = "I-REQ-002"
	CodeToolPanic     = "S-TOOL-PANIC"
	CodeToolConfig    = "S-TOOL-CONFIG"
	CodeRedelivered   = "S-TOOL-REDELIVERY"
	CodeUnknownTool   = "C-CONTRACT-001"
	CodeCanceled      = "CANCELED"
	codeErrorCanceled = protocol.ErrorCodeCanceled
)

// L0 error codes (the protocol's `error.code`).
const (
	ErrToolTimeout         = protocol.ErrorCodeToolTimeout
	ErrAuthFailed          = protocol.ErrorCodeAuthFailed
	ErrBadRequest          = protocol.ErrorCodeBadRequest
	ErrUpstreamUnavailable = protocol.ErrorCodeUpstreamUnavailable
	ErrInternal            = protocol.ErrorCodeInternal
)

// class is the taxonomy class prefix of a code ("R-TIMEOUT", "I-REQ"...).
func class(code string) string {
	parts := strings.SplitN(code, "-", 3)
	if len(parts) < 2 {
		return code
	}
	return parts[0] + "-" + parts[1]
}

// Status is the L0 status and error code a worker sees when o is a call's
// final outcome: what a tool's author checks a mapping against.
func (o Outcome) Status() (status, errCode string) { return l0(o) }

// ResultContent is the content of the tool.result card written when o is a
// call's final outcome after attempts attempts, with its L0 status: what a
// worker reads.
func (o Outcome) ResultContent(attempts int) (content json.RawMessage, status string, err error) {
	return resultContent(o, attempts, false)
}

// l0 maps a final outcome to the L0 status and error code (DESIGN invariant 6).
func l0(o Outcome) (status, errCode string) {
	switch o.Kind {
	case KindSuccess:
		return protocol.StatusSuccess, ""
	case KindPartial:
		return protocol.StatusPartial, ""
	case KindInvalid:
		return protocol.StatusFailed, ErrBadRequest
	}
	if o.Code == CodeCanceled {
		return protocol.StatusCanceled, codeErrorCanceled
	}
	if o.Code == protocol.CodeToolUnavailable {
		// As the ledger answers it at dispatch: nobody could run the tool.
		return protocol.StatusFailed, ErrUpstreamUnavailable
	}
	switch class(o.Code) {
	case "R-TIMEOUT":
		return protocol.StatusTimeout, ErrToolTimeout
	case "R-UPSTREAM", "R-CAP":
		return protocol.StatusFailed, ErrUpstreamUnavailable
	case "A-AUTH":
		return protocol.StatusFailed, ErrAuthFailed
	case "I-REQ", "P-PRECOND", "C-CONTRACT":
		return protocol.StatusFailed, ErrBadRequest
	}
	return protocol.StatusFailed, ErrInternal
}

// retryable reports whether a failed attempt may be retried under the
// tool's determinism: side-effectful tools are never retried automatically;
// S-TOOL faults are retried once (seed 004).
func retryable(o Outcome, determinism string, attempt int) bool {
	if o.Kind != KindRetryable || determinism == protocol.DeterminismSideEffectful {
		return false
	}
	if class(o.Code) == "S-TOOL" {
		return attempt < 2
	}
	return true
}

// errorDetail is error.detail of a result card.
type errorDetail struct {
	TaxonomyCode string               `json:"taxonomy_code"`
	Class        OutcomeKind          `json:"class"`
	FixHint      string               `json:"fix_hint,omitempty"`
	Attempts     int                  `json:"attempts"`
	RetryAfterMS int64                `json:"retry_after_ms,omitempty"`
	Violations   []protocol.Violation `json:"violations,omitempty"`
	// Reconciled marks the outcome of an attempt left open by a crash, as
	// the tool's reconcile found it (the report says attempt_outcome
	// reconciled for every status).
	Reconciled bool `json:"reconciled,omitempty"`
	// Result is what the tool returned when that is not the call's result:
	// a result that broke the tool's result_schema.
	Result any `json:"result,omitempty"`
	// Progress is the call's recorded progress (Call.Progress).
	Progress []Progress `json:"progress,omitempty"`
}

// resultContent builds a ToolResultContent for the final outcome.
func resultContent(o Outcome, attempts int, reconciled bool) (json.RawMessage, string, error) {
	status, errCode := l0(o)
	type errBody struct {
		Code    string      `json:"code"`
		Message string      `json:"message"`
		Detail  errorDetail `json:"detail"`
	}
	c := struct {
		Status string   `json:"status"`
		Result any      `json:"result"`
		Error  *errBody `json:"error,omitempty"`
	}{Status: status}
	switch o.Kind {
	case KindSuccess:
		c.Result = o.Output
	default:
		hint := o.Hint
		if hint == "" {
			hint = defaultHint(o)
		}
		d := errorDetail{TaxonomyCode: o.Code, Class: o.Kind, FixHint: hint, Attempts: attempts, Violations: o.Violations, Reconciled: reconciled, Progress: o.progress}
		if o.RetryAfter > 0 {
			d.RetryAfterMS = o.RetryAfter.Milliseconds()
		}
		if o.Code == protocol.CodeResultContract {
			d.Result = o.Output
		}
		if o.Kind == KindPartial {
			c.Result = o.Output
			if errCode == "" {
				errCode = ErrInternal
			}
		} else {
			c.Result = map[string]any{"error_code": errCode, "error_message": o.Message}
		}
		c.Error = &errBody{Code: errCode, Message: o.Message, Detail: d}
	}
	b, err := json.Marshal(c)
	return b, status, err
}

func defaultHint(o Outcome) string {
	switch class(o.Code) {
	case "R-TIMEOUT":
		return "increase the call's timeout_ms (up to the tool's timeout_ms_max) or make the tool faster"
	case "R-UPSTREAM", "R-CAP":
		return "the upstream is unavailable or rate-limited; retry later"
	case "A-AUTH":
		return "check the credentials in the environment variable the tool uses"
	case "I-REQ":
		return "fix the arguments listed in violations"
	case "C-CONTRACT":
		if o.Code == protocol.CodeResultContract {
			return "fix the tool to return what its result_schema describes"
		}
		return "register the tool in the project, or call a registered one"
	case "S-TOOL":
		return "a tool fault: report it to the tool's owner"
	}
	if o.Code == CodeCanceled {
		return "the call was canceled by its worker"
	}
	return ""
}
