package jina

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cgledger/cgledger/executor"

	"github.com/cgledger/cgledger/protocol"
)

// Config configures the built-in HTTP tool. Zero values are the
// documented defaults.
type Config struct {
	// AllowedHosts are the hosts the tool may reach (the request's and every
	// redirect's): exact, case-insensitive host names or IP literals; an
	// entry with a port ("api.example:8443") allows only that port, one
	// without allows any. Empty means s.jina.ai and r.jina.ai (seed 003).
	AllowedHosts []string
	// AllowLoopbackPorts are loopback ports that may be dialed despite the
	// address guard. For tests only: production configurations leave it
	// empty, and the tool never reaches loopback, private, link-local,
	// CGNAT, multicast or unspecified addresses.
	AllowLoopbackPorts []int
	// MaxResponseBytes caps the (decompressed) response body. Zero means
	// 1 MiB; a larger body fails the call with S-TOOL-TOOLARGE.
	MaxResponseBytes int64
	// LookupEnv reads the API key's environment variable at run time. Nil
	// means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// Logger receives one debug line per request (host, status, outcome
	// code, duration: never URLs, arguments, headers or keys). Nil discards.
	Logger *slog.Logger
}

// Defaults and taxonomy codes of the HTTP tool.
const (
	DefaultMaxResponseBytes = 1 << 20
	DefaultAuthEnv          = "JINA_API_KEY"
	httpMaxRedirects        = 5
	httpErrorSnippet        = 512
	httpRedacted            = "[REDACTED]"

	CodeHostRefused = "P-PRECOND-HOST"
	CodeAddrRefused = "P-PRECOND-ADDR"
	CodeRedirects   = "P-PRECOND-REDIRECT"
	CodeTLS         = "P-PRECOND-TLS"
	CodeTooLarge    = "S-TOOL-TOOLARGE"
	CodeNetwork     = "R-UPSTREAM-NET"
	CodeRateLimited = "R-CAP-429"
)

// DefaultAllowedHosts are the hosts the HTTP tool reaches when
// Config.AllowedHosts is empty.
var DefaultAllowedHosts = []string{"s.jina.ai", "r.jina.ai"}

type hostRule struct {
	host string // lower case, no trailing dot, no brackets
	port string // "" means any
}

type httpTool struct {
	allowed  []hostRule
	maxBytes int64
	env      func(string) (string, bool)
	log      *slog.Logger
	client   *http.Client
}

// hostRefusedError is a request or redirect to a host or scheme the tool
// may not use.
type hostRefusedError struct {
	Host   string
	Reason string
}

func (e *hostRefusedError) Error() string { return e.Reason }

var errTooManyRedirects = fmt.Errorf("stopped after %d redirects", httpMaxRedirects)

// New returns the built-in HTTP/OpenAPI tool (seed 003 section 4):
// it calls the Jina search or reader API described by the call's
// options.jina, with the API key from the environment variable named by
// options.jina.auth_env, only on allowed hosts and never on non-public
// addresses.
func New(cfg Config) executor.Tool {
	t := &httpTool{maxBytes: cfg.MaxResponseBytes, env: cfg.LookupEnv, log: cfg.Logger}
	if t.maxBytes <= 0 {
		t.maxBytes = DefaultMaxResponseBytes
	}
	if t.env == nil {
		t.env = os.LookupEnv
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	hosts := cfg.AllowedHosts
	if len(hosts) == 0 {
		hosts = DefaultAllowedHosts
	}
	for _, h := range hosts {
		if r, ok := parseHostRule(h); ok {
			t.allowed = append(t.allowed, r)
		}
	}
	guard := newDialGuard(cfg.AllowLoopbackPorts)
	tr := &http.Transport{
		Proxy:                  nil, // never HTTP_PROXY & co: the guard must see the real upstream
		DialContext:            guard.DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           32,
		MaxIdleConnsPerHost:    8,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12},
	}
	t.client = &http.Client{Transport: tr, CheckRedirect: t.checkRedirect}
	return t
}

func parseHostRule(s string) (hostRule, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return hostRule{}, false
	}
	var r hostRule
	if h, p, err := net.SplitHostPort(s); err == nil {
		r.host, r.port = h, p
	} else {
		r.host = strings.Trim(s, "[]")
	}
	r.host = strings.TrimSuffix(r.host, ".")
	return r, r.host != ""
}

func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

// checkURL refuses a URL whose scheme is not http(s) or whose host is not
// on the allowlist.
func (t *httpTool) checkURL(u *url.URL) error {
	if u.Scheme != "http" && u.Scheme != "https" {
		return &hostRefusedError{Host: u.Host, Reason: fmt.Sprintf("scheme %q is not allowed (only http and https)", u.Scheme)}
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	port := u.Port()
	if port == "" {
		port = defaultPort(u.Scheme)
	}
	for _, r := range t.allowed {
		if r.host == host && (r.port == "" || r.port == port) {
			return nil
		}
	}
	return &hostRefusedError{Host: u.Host, Reason: fmt.Sprintf("host %q is not on the HTTP tool's allowlist", u.Host)}
}

func (t *httpTool) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > httpMaxRedirects {
		return errTooManyRedirects
	}
	if err := t.checkURL(req.URL); err != nil {
		he := err.(*hostRefusedError)
		he.Reason = "redirect refused: " + he.Reason
		return he
	}
	if prev := via[len(via)-1].URL; prev.Scheme == "https" && req.URL.Scheme != "https" {
		return &hostRefusedError{Host: req.URL.Host, Reason: fmt.Sprintf("redirect refused: downgrade from https to %s (host %q)", req.URL.Scheme, req.URL.Host)}
	}
	return nil
}

// Run implements Tool.
func (t *httpTool) Run(ctx context.Context, call *executor.Call) executor.Outcome {
	var forms []string
	o := t.run(ctx, call, &forms)
	// A second pass over everything returned: the key never leaves the tool.
	return scrubOutcome(o, forms)
}

func (t *httpTool) run(ctx context.Context, call *executor.Call, forms *[]string) executor.Outcome {
	j, err := OptionsOf(call.Definition)
	if err != nil {
		return executor.Terminal(executor.CodeToolConfig, err.Error(), "fix the tool's options.jina")
	}
	if j == nil {
		return executor.Terminal(executor.CodeToolConfig, "options.jina is required", `register the tool with options.jina {mode: "search"|"reader", base_url, ...}`)
	}
	if !call.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, call.Deadline)
		defer cancel()
	}
	req, bad := t.buildRequest(ctx, j, call)
	if bad != nil {
		return *bad
	}
	if err := t.checkURL(req.URL); err != nil {
		return executor.Terminal(CodeHostRefused, err.Error(), "use a base_url on an allowed host ("+t.allowedList()+")")
	}
	authEnv := j.AuthEnv
	if authEnv == "" {
		authEnv = DefaultAuthEnv
	}
	key, _ := t.env(authEnv)
	key = strings.TrimSpace(key)
	*forms = httpSecretForms(key)
	if key != "" {
		if !validHeaderValue(key) {
			return executor.Terminal(executor.CodeToolConfig, fmt.Sprintf("the API key in $%s contains characters not allowed in an HTTP header", authEnv), "fix the value of $"+authEnv)
		}
		req.Header.Set("Authorization", "Bearer "+key)
	}

	start := time.Now()
	host := req.URL.Host
	resp, err := t.client.Do(req)
	var o executor.Outcome
	if err != nil {
		o = t.transportError(ctx, err)
	} else {
		o = t.response(ctx, resp, authEnv, key != "", *forms)
		host = resp.Request.URL.Host
	}
	t.log.Debug("http tool request", "tool", call.ToolName, "mode", j.Mode, "host", host,
		"status", statusOf(resp), "outcome", string(o.Kind), "code", o.Code,
		"duration_ms", time.Since(start).Milliseconds())
	return o
}

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

func (t *httpTool) allowedList() string {
	s := make([]string, len(t.allowed))
	for i, r := range t.allowed {
		s[i] = r.host
		if r.port != "" {
			s[i] = net.JoinHostPort(r.host, r.port)
		}
	}
	return strings.Join(s, ", ")
}

// buildRequest makes the upstream request from options.jina and the
// arguments; a non-nil Outcome means the call cannot run.
func (t *httpTool) buildRequest(ctx context.Context, j *Options, call *executor.Call) (*http.Request, *executor.Outcome) {
	fail := func(msg, hint string) (*http.Request, *executor.Outcome) {
		o := executor.Terminal(executor.CodeToolConfig, msg, hint)
		return nil, &o
	}
	method := strings.ToUpper(j.Method)
	if method == "" {
		method = http.MethodGet
	}
	if method != http.MethodGet && method != http.MethodPost {
		return fail(fmt.Sprintf("options.jina.method must be GET or POST, got %q", j.Method), "fix the tool's options.jina.method")
	}
	base, err := url.Parse(j.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" || base.User != nil {
		return fail(fmt.Sprintf("options.jina.base_url must be an http(s) URL with a host, got %q", clipString(j.BaseURL, 200)), "fix the tool's options.jina.base_url")
	}
	base.Fragment, base.RawFragment = "", ""
	// base + path, with exactly one slash between them.
	prefix := strings.TrimRight(base.Path, "/")
	if p := strings.Trim(j.Path, "/"); p != "" {
		prefix += "/" + p
	}

	var body []byte
	var u *url.URL
	switch j.Mode {
	case "search":
		q, vs := stringArg(call, "query")
		if vs != nil {
			o := executor.Invalid("search needs arguments.query", *vs)
			return nil, &o
		}
		u = cloneURL(base)
		u.Path, u.RawPath = prefix+"/", ""
		if j.Path != "" && !strings.HasSuffix(j.Path, "/") {
			u.Path = prefix
		}
		if method == http.MethodGet {
			qs := u.Query()
			qs.Set("q", q)
			u.RawQuery = qs.Encode()
		} else {
			body, _ = json.Marshal(map[string]string{"q": q})
		}
	case "reader":
		raw, vs := stringArg(call, "url")
		if vs != nil {
			o := executor.Invalid("reader needs arguments.url", *vs)
			return nil, &o
		}
		target, err := url.Parse(raw)
		if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
			o := executor.Invalid("reader needs an http(s) URL in arguments.url", protocol.Violation{
				Field: "arguments.url", Code: protocol.VInvalidValue,
				Message: fmt.Sprintf("must be an absolute http(s) URL, got %q", clipString(raw, 200)),
			})
			return nil, &o
		}
		target.Fragment, target.RawFragment = "", ""
		if method == http.MethodGet {
			// Jina's reader takes the page URL as the path: <base>/<url>.
			s := strings.TrimRight((&url.URL{Scheme: base.Scheme, Host: base.Host}).String()+prefix, "/") + "/" + target.String()
			u, err = url.Parse(s)
			if err != nil {
				o := executor.Invalid("reader cannot use arguments.url", protocol.Violation{Field: "arguments.url", Code: protocol.VInvalidValue, Message: "cannot be appended to the reader's base URL"})
				return nil, &o
			}
		} else {
			u = cloneURL(base)
			u.Path, u.RawPath = prefix+"/", ""
			body, _ = json.Marshal(map[string]string{"url": target.String()})
		}
	default:
		return fail(fmt.Sprintf(`options.jina.mode must be "search" or "reader", got %q`, clipString(j.Mode, 64)), "fix the tool's options.jina.mode")
	}

	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return fail(fmt.Sprintf("cannot build the upstream request: %v", err), "fix the tool's options.jina")
	}
	req.Header.Set("Accept", "application/json, text/plain;q=0.9, */*;q=0.8")
	req.Header.Set("User-Agent", "cgledger-http-tool/1")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if call.IdempotencyKey != "" {
		// The same key on every delivery and retry of the call, so an
		// upstream that deduplicates sees one request (docs/protocol.md).
		req.Header.Set(protocol.HTTPIdempotencyKey, call.IdempotencyKey)
	}
	return req, nil
}

func cloneURL(u *url.URL) *url.URL {
	c := *u
	return &c
}

// stringArg reads a required non-empty string argument.
func stringArg(call *executor.Call, name string) (string, *protocol.Violation) {
	field := "arguments." + name
	v, ok := call.Arguments[name]
	if !ok || v == nil {
		return "", &protocol.Violation{Field: field, Code: protocol.VRequired, Message: "is required"}
	}
	s, ok := v.(string)
	if !ok {
		return "", &protocol.Violation{Field: field, Code: protocol.VInvalidType, Message: fmt.Sprintf("must be a string, got %T", v)}
	}
	if strings.TrimSpace(s) == "" {
		return "", &protocol.Violation{Field: field, Code: protocol.VEmpty, Message: "must not be empty"}
	}
	return s, nil
}

func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

func clipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// transportError maps a failed round trip (no response) to an outcome.
func (t *httpTool) transportError(ctx context.Context, err error) executor.Outcome {
	var blocked *blockedAddrError
	var refused *hostRefusedError
	var certErr *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	var invalidCert x509.CertificateInvalidError
	switch {
	case errors.As(err, &blocked):
		return executor.Terminal(CodeAddrRefused, blocked.Error(),
			"the upstream resolves or redirects to a non-public address, which the HTTP tool never reaches")
	case errors.As(err, &refused):
		return executor.Terminal(CodeHostRefused, refused.Error(), "the HTTP tool only reaches "+t.allowedList())
	case errors.Is(err, errTooManyRedirects):
		return executor.Terminal(CodeRedirects, "the upstream "+errTooManyRedirects.Error(), "")
	case ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return executor.Retryable(executor.CodeTimeout, "the upstream did not answer within the call's deadline", 0)
	case ctx.Err() != nil:
		return executor.Terminal(executor.CodeCanceled, "the call was canceled while waiting for the upstream", "")
	case errors.As(err, &certErr), errors.As(err, &unknownCA), errors.As(err, &badHost), errors.As(err, &invalidCert):
		return executor.Terminal(CodeTLS, "the upstream's TLS certificate was not accepted: "+innerError(err), "")
	}
	return executor.Retryable(CodeNetwork, "network error reaching the upstream: "+innerError(err), 0)
}

// innerError is err without net/http's `Get "<url>": ` prefix.
func innerError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err.Error()
	}
	return err.Error()
}

// response maps the upstream's response to an outcome.
func (t *httpTool) response(ctx context.Context, resp *http.Response, authEnv string, keySent bool, forms []string) executor.Outcome {
	defer resp.Body.Close()
	if resp.ContentLength > t.maxBytes {
		return t.tooLarge()
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, t.maxBytes+1))
	if err != nil {
		return t.transportError(ctx, err)
	}
	if int64(len(data)) > t.maxBytes {
		return t.tooLarge()
	}
	ct := scrubString(resp.Header.Get("Content-Type"), forms)
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		// JSON is scrubbed after decoding (whatever its escaping), text here.
		return executor.Success(map[string]any{"status_code": code, "content_type": ct, "body": scrubValue(decodeBody(ct, data), forms)})
	}
	// Error bodies are quoted in messages: scrub before clipping, so that
	// no prefix of the key survives a cut.
	data = []byte(scrubString(string(data), forms))
	switch {
	case code == http.StatusTooManyRequests:
		return executor.Retryable(CodeRateLimited, upstreamMessage(code, data), retryAfter(resp.Header.Get("Retry-After")))
	case code == http.StatusRequestTimeout:
		return executor.Retryable(fmt.Sprintf("R-UPSTREAM-%d", code), upstreamMessage(code, data), retryAfter(resp.Header.Get("Retry-After")))
	case code >= 500:
		return executor.Retryable(fmt.Sprintf("R-UPSTREAM-%d", code), upstreamMessage(code, data), retryAfter(resp.Header.Get("Retry-After")))
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		hint := "check the API key in $" + authEnv
		if !keySent {
			hint = "no API key was sent: set $" + authEnv + " in the executor's environment"
		}
		return executor.Terminal(fmt.Sprintf("A-AUTH-%d", code), upstreamMessage(code, data), hint)
	case code >= 400:
		return executor.Terminal(fmt.Sprintf("I-REQ-%d", code), upstreamMessage(code, data), "the upstream refused the request: fix the arguments")
	}
	// 1xx and 3xx that were not followed (no Location, 304...).
	return executor.Terminal(fmt.Sprintf("P-PRECOND-%d", code), upstreamMessage(code, data), "")
}

func (t *httpTool) tooLarge() executor.Outcome {
	return executor.Terminal(CodeTooLarge, fmt.Sprintf("the upstream response exceeds the HTTP tool's limit of %d bytes", t.maxBytes),
		"request less (a narrower query or a smaller page), or raise the executor's MaxResponseBytes")
}

func upstreamMessage(code int, body []byte) string {
	msg := fmt.Sprintf("upstream answered %d %s", code, http.StatusText(code))
	if s := strings.TrimSpace(strings.ToValidUTF8(string(body), "\uFFFD")); s != "" {
		msg += ": " + clipString(s, httpErrorSnippet)
	}
	return msg
}

// decodeBody is the parsed JSON of a JSON response, else its text.
func decodeBody(contentType string, data []byte) any {
	if mt, _, err := mime.ParseMediaType(contentType); err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err == nil {
			if _, err := dec.Token(); err == io.EOF {
				return v
			}
		}
	}
	return strings.ToValidUTF8(string(data), "\uFFFD")
}

// retryAfter parses Retry-After: delay seconds or an HTTP date; 0 when
// absent, malformed or past.
func retryAfter(h string) time.Duration {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0
	}
	if n, err := strconv.ParseInt(h, 10, 64); err == nil {
		if n <= 0 || n > 365*24*3600 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if at, err := http.ParseTime(h); err == nil {
		if d := time.Until(at); d > 0 {
			return d.Round(time.Second)
		}
	}
	return 0
}

// httpSecretForms are the spellings of the API key the tool scrubs: raw,
// JSON-escaped and URL-escaped. Keys shorter than 4 bytes are not
// scrubbed (they would mangle every output and protect nothing).
func httpSecretForms(key string) []string {
	if len(key) < 4 {
		return nil
	}
	forms := []string{key}
	add := func(s string) {
		for _, f := range forms {
			if f == s {
				return
			}
		}
		forms = append(forms, s)
	}
	if esc, err := json.Marshal(key); err == nil && len(esc) > 2 {
		add(string(esc[1 : len(esc)-1]))
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if enc.Encode(key) == nil {
		if esc := strings.TrimSpace(buf.String()); len(esc) > 2 {
			add(esc[1 : len(esc)-1])
		}
	}
	add(url.QueryEscape(key))
	add(url.PathEscape(key))
	return forms
}

func scrubString(s string, forms []string) string {
	for _, f := range forms {
		s = strings.ReplaceAll(s, f, httpRedacted)
	}
	return s
}

// scrubValue replaces the key in every string (and map key) of v.
func scrubValue(v any, forms []string) any {
	switch t := v.(type) {
	case string:
		return scrubString(t, forms)
	case json.Number:
		if r := scrubString(string(t), forms); r != string(t) {
			return r
		}
		return t
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			out[scrubString(k, forms)] = scrubValue(x, forms)
		}
		return out
	case []any:
		for i, x := range t {
			t[i] = scrubValue(x, forms)
		}
		return t
	}
	return v
}

// scrubOutcome removes the API key from everything the tool returns.
func scrubOutcome(o executor.Outcome, forms []string) executor.Outcome {
	if len(forms) == 0 {
		return o
	}
	o.Output = scrubValue(o.Output, forms)
	o.Message = scrubString(o.Message, forms)
	o.Hint = scrubString(o.Hint, forms)
	for i := range o.Violations {
		o.Violations[i].Message = scrubString(o.Violations[i].Message, forms)
	}
	return o
}
