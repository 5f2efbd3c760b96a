// Package httpclient is a typed Go client of cgledger's HTTP API
// (docs/audit-api.md, docs/openapi.json): one method per route, answers
// decoded into the exported answer types of the packages that produce them,
// and refusals as *Problem. The request/reply API over NATS has its own
// client, package client.
package httpclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// maxAnswerBytes bounds an answer read into memory (the export streams and
// is not bounded).
const maxAnswerBytes = 64 << 20

// Client talks to one cgledger server's HTTP API. It is safe for
// concurrent use when its *http.Client and answer hook are.
type Client struct {
	base   string
	token  string
	hc     *http.Client
	answer func(body []byte)
}

// Option sets a Client's optional settings.
type Option func(*Client)

// WithToken sends token as the bearer credential of every request (the
// JWT of a credential file, auth.ReadCreds).
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithHTTPClient sends requests with hc (its transport carries TLS and
// proxy settings) instead of http.DefaultClient.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithAnswerHook calls f with the body of every successful JSON answer as
// received, before it is decoded: the CLI's --json prints the server's
// answer byte for byte from it.
func WithAnswerHook(f func(body []byte)) Option { return func(c *Client) { c.answer = f } }

// New returns a client of the server at baseURL (such as
// http://127.0.0.1:8080; a trailing slash is ignored).
func New(baseURL string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), hc: http.DefaultClient}
	for _, o := range opts {
		o(c)
	}
	return c
}

// BaseURL is the server's base URL, without a trailing slash.
func (c *Client) BaseURL() string { return c.base }

// TransportError is a request that got no HTTP answer (the server could
// not be reached, or the connection broke while reading the answer).
type TransportError struct {
	Method, URL string
	// Reading is true when the answer started but its body could not be
	// read.
	Reading bool
	Err     error
}

// Error names the request and the cause.
func (e *TransportError) Error() string {
	if e.Reading {
		return fmt.Sprintf("%s %s: reading the answer: %v", e.Method, e.URL, e.Err)
	}
	return fmt.Sprintf("%s %s: %v", e.Method, e.URL, e.Err)
}

// Unwrap is the transport's error (context errors included).
func (e *TransportError) Unwrap() error { return e.Err }

// Problem is an error answer of the server (status 400 and above): RFC
// 9457 problem details (application/problem+json) with the protocol's code
// and every violation. Code is empty when the body is not a problem (a
// proxy's page, say); Body holds it as received.
type Problem struct {
	Method, URL string
	Status      int
	Type        string
	Title       string
	// Detail is the human-readable explanation (the legacy error's
	// message when the body has one).
	Detail       string
	Code         protocol.Code
	Violations   []protocol.Violation
	RejectionSeq uint64
	// Body is the answer as received.
	Body []byte
}

// Error renders the code and detail, or the status and body when the
// answer is not a problem.
func (p *Problem) Error() string {
	if p.Code == "" {
		return fmt.Sprintf("%s %s: HTTP %d: %s", p.Method, p.URL, p.Status, strings.TrimSpace(string(p.Body)))
	}
	return fmt.Sprintf("%s %s: HTTP %d: %s: %s", p.Method, p.URL, p.Status, p.Code, p.Detail)
}

// Protocol is the problem as the protocol's error (code, message,
// violations, rejection sequence), so errors.Is matches its sentinels.
func (p *Problem) Protocol() *protocol.Error {
	return &protocol.Error{Code: p.Code, Message: p.Detail, Violations: p.Violations, Seq: p.RejectionSeq}
}

// Unwrap is Protocol, when the answer was a problem.
func (p *Problem) Unwrap() error {
	if p.Code == "" {
		return nil
	}
	return p.Protocol()
}

// problemFrom reads an error answer: the legacy "error" member wins when
// present (earlier servers send only it), else the problem's members.
func problemFrom(method, u string, status int, raw []byte) *Problem {
	p := &Problem{Method: method, URL: u, Status: status, Body: raw}
	var body struct {
		Type         string               `json:"type"`
		Title        string               `json:"title"`
		Detail       string               `json:"detail"`
		Code         protocol.Code        `json:"code"`
		Violations   []protocol.Violation `json:"violations"`
		RejectionSeq uint64               `json:"rejection_seq"`
		Error        protocol.Error       `json:"error"`
	}
	if json.Unmarshal(raw, &body) != nil {
		return p
	}
	p.Type, p.Title = body.Type, body.Title
	if body.Error.Code != "" {
		p.Code, p.Detail, p.Violations, p.RejectionSeq = body.Error.Code, body.Error.Message, body.Error.Violations, body.Error.Seq
		return p
	}
	p.Code, p.Detail, p.Violations, p.RejectionSeq = body.Code, body.Detail, body.Violations, body.RejectionSeq
	return p
}

// AsOf asks for an answer as the views stood at a point of the ledger: Seq
// (right after that sequence) wins over Time; zero values mean now.
type AsOf struct {
	Seq  uint64
	Time time.Time
}

func (a AsOf) set(q url.Values) {
	if a.Seq > 0 {
		q.Set("as_of_seq", strconv.FormatUint(a.Seq, 10))
	}
	if !a.Time.IsZero() {
		q.Set("as_of", a.Time.Format(time.RFC3339Nano))
	}
}

// List is a page request of a listing: as of a point, at most Limit items
// (0: the server's default), continuing from Cursor (a page's
// next_cursor; empty for the first page).
type List struct {
	AsOf
	Limit  int
	Cursor string
}

func (l List) set(q url.Values) {
	l.AsOf.set(q)
	if l.Limit > 0 {
		q.Set("limit", strconv.Itoa(l.Limit))
	}
	if l.Cursor != "" {
		q.Set("cursor", l.Cursor)
	}
}

// path joins segments, each escaped.
func path(segs ...string) string {
	var b strings.Builder
	for _, s := range segs {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// send makes one request and returns the answer when its status is below
// 400 (the caller closes its body), a *Problem otherwise.
func (c *Client) send(ctx context.Context, method, p string, q url.Values, body any) (*http.Response, error) {
	u := c.base + p
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var r io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil:
	case rawBody:
		r, contentType = bytes.NewReader(b.data), b.contentType
	default:
		data, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("%s %s: encode the body: %w", method, u, err)
		}
		r, contentType = bytes.NewReader(data), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		// A *url.Error, which names the URL already.
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, &TransportError{Method: method, URL: u, Err: err}
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
		if err != nil {
			return nil, &TransportError{Method: method, URL: u, Reading: true, Err: err}
		}
		return nil, problemFrom(method, u, resp.StatusCode, raw)
	}
	return resp, nil
}

// rawBody is a request body sent as it is.
type rawBody struct {
	data        []byte
	contentType string
}

// do makes one request and decodes its JSON answer into out.
func (c *Client) do(ctx context.Context, method, p string, q url.Values, body, out any) error {
	resp, err := c.send(ctx, method, p, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return c.decode(resp, method, out)
}

func (c *Client) decode(resp *http.Response, method string, out any) error {
	u := resp.Request.URL.String()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return &TransportError{Method: method, URL: u, Reading: true, Err: err}
	}
	if c.answer != nil {
		c.answer(raw)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: the answer does not decode: %w", method, u, err)
	}
	return nil
}

// get is do for a GET whose answer is a T.
func get[T any](ctx context.Context, c *Client, p string, q url.Values) (T, error) {
	var out T
	err := c.do(ctx, http.MethodGet, p, q, nil, &out)
	return out, err
}

// post is do for a POST of a JSON body whose answer is a T.
func post[T any](ctx context.Context, c *Client, p string, body any) (T, error) {
	var out T
	err := c.do(ctx, http.MethodPost, p, nil, body, &out)
	return out, err
}

// IsNotFound reports whether err is a 404 answer.
func IsNotFound(err error) bool {
	var p *Problem
	return errors.As(err, &p) && p.Status == http.StatusNotFound
}
