// Package problem writes the error bodies of cgledger's HTTP APIs as RFC 9457
// problem details (application/problem+json). It depends on nothing else in
// cgledger, so every HTTP layer (the authentication policy included) writes
// the same shape.
//
// A body is
//
//	{"type", "title", "status", "detail", "code", "violations": [{"field", "code", "message"}],
//	 "rejection_seq", "error": {"code", "message", "violations", "rejection_seq"}}
//
// type is TypeBase + code, a stable identifier of the problem kind; title is
// a short fixed text for the code; detail is the message; code and
// violations are the protocol's (docs/protocol.md), omitted violations and
// rejection_seq when empty. error repeats code, message (= detail),
// violations and rejection_seq in the shape bodies had before problem
// details; it is deprecated and goes away in a later release.
package problem

import (
	"encoding/json"
	"net/http"
)

// ContentType is the media type of a problem body (RFC 9457).
const ContentType = "application/problem+json"

// TypeBase prefixes a problem's code to make its type URI. The URI
// identifies the kind of problem; it is not promised to resolve.
const TypeBase = "https://cgledger.dev/problems/"

// Codes the HTTP layers use besides the protocol's own (protocol.Code*).
const (
	// CodeMethodNotAllowed: the path exists, not for this method (405,
	// with an Allow header).
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeUnauthenticated: no valid bearer token (401).
	CodeUnauthenticated = "unauthenticated"
	// CodeForbidden: the credential may not make this request (403).
	CodeForbidden = "forbidden"
	// CodeStarting: serve is still starting (restoring its views, waiting
	// for the cluster) and answers only /healthz, /readyz, /metrics and
	// /v1/openapi.json (503, with Retry-After).
	CodeStarting = "starting"
)

// Violation is one problem with a request, as the protocol reports it.
type Violation struct {
	Field   string `json:"field"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Legacy is the deprecated "error" member: the body before problem details.
type Legacy struct {
	Code         string      `json:"code"`
	Message      string      `json:"message"`
	Violations   []Violation `json:"violations,omitempty"`
	RejectionSeq uint64      `json:"rejection_seq,omitempty"`
}

// Details is a problem details body.
type Details struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Code and Violations are extension members: the protocol's error code
	// and every violation found.
	Code       string      `json:"code"`
	Violations []Violation `json:"violations,omitempty"`
	// RejectionSeq is the ledger sequence of the rejection entry recording
	// the refusal, when one was written.
	RejectionSeq uint64 `json:"rejection_seq,omitempty"`
	// Error is deprecated: the same facts in the shape of earlier releases.
	Error Legacy `json:"error"`
}

// titles are the fixed short texts of the codes cgledger answers over HTTP.
var titles = map[string]string{
	"bad_request":        "Bad request",
	"not_found":          "Not found",
	"internal":           "Internal error",
	"unknown_call":       "Unknown call",
	"unknown_card":       "Unknown card",
	"mismatch":           "Mismatch",
	"stale_epoch":        "Stale epoch",
	"conflict":           "Conflict",
	"not_reported":       "Not reported",
	CodeMethodNotAllowed: "Method not allowed",
	CodeUnauthenticated:  "Authentication required",
	CodeForbidden:        "Forbidden",
	CodeStarting:         "Starting",
}

// Title is the short text of code; an unknown code gets the status's text.
func Title(code string, status int) string {
	if t, ok := titles[code]; ok {
		return t
	}
	return http.StatusText(status)
}

// New builds the problem for code with status and detail.
func New(status int, code, detail string, vs []Violation) *Details {
	return &Details{
		Type: TypeBase + code, Title: Title(code, status), Status: status, Detail: detail,
		Code: code, Violations: vs,
		Error: Legacy{Code: code, Message: detail, Violations: vs},
	}
}

// WithRejection sets the rejection entry's sequence (both members).
func (d *Details) WithRejection(seq uint64) *Details {
	d.RejectionSeq, d.Error.RejectionSeq = seq, seq
	return d
}

// Write sends d with its status.
func Write(w http.ResponseWriter, d *Details) {
	w.Header().Set("Content-Type", ContentType)
	w.Header().Del("Content-Length")
	w.WriteHeader(d.Status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(d)
}
