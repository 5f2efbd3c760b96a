package jina

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cgledger/cgledger/executor"

	"github.com/cgledger/cgledger/protocol"
)

// seen is what an upstream received.
type seen struct {
	Method, RequestURI, Path, Auth, ContentType, IdempotencyKey string
	Query                                                       url.Values
	Body                                                        []byte
}

type recorder struct {
	mu   sync.Mutex
	reqs []seen
}

func (r *recorder) add(req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, seen{
		Method: req.Method, RequestURI: req.RequestURI, Path: req.URL.Path, Query: req.URL.Query(),
		Auth: req.Header.Get("Authorization"), ContentType: req.Header.Get("Content-Type"), Body: b,
		IdempotencyKey: req.Header.Get("Idempotency-Key"),
	})
}

func (r *recorder) all() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.reqs...)
}

func (r *recorder) last(t *testing.T) seen {
	t.Helper()
	all := r.all()
	if len(all) == 0 {
		t.Fatal("upstream received no request")
	}
	return all[len(all)-1]
}

// upstream starts a loopback server and returns it with its port.
func upstream(t *testing.T, h http.Handler) (*httptest.Server, int) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, srv.Listener.Addr().(*net.TCPAddr).Port
}

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// loopbackTool is an HTTP tool allowed to reach 127.0.0.1 on ports.
func loopbackTool(t *testing.T, env map[string]string, ports ...int) *httpTool {
	t.Helper()
	return New(Config{
		AllowedHosts:       []string{"127.0.0.1"},
		AllowLoopbackPorts: ports,
		LookupEnv:          envMap(env),
	}).(*httpTool)
}

func jinaCall(mode, baseURL, path, method string, args map[string]any) *executor.Call {
	return callWith(Options{Mode: mode, BaseURL: baseURL, Path: path, Method: method}, args)
}

// callWith is a call of a tool registered with options.jina j.
func callWith(j Options, args map[string]any) *executor.Call {
	opts, err := json.Marshal(map[string]Options{OptionsKey: j})
	if err != nil {
		panic(err)
	}
	return &executor.Call{ToolName: "web", Arguments: args, Definition: &protocol.ToolDefinition{ToolName: "web", Options: opts}}
}

func run(t *testing.T, tool executor.Tool, c *executor.Call) executor.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return tool.Run(ctx, c)
}

func wantKind(t *testing.T, o executor.Outcome, kind executor.OutcomeKind, code string) {
	t.Helper()
	if o.Kind != kind || o.Code != code {
		t.Fatalf("outcome = %s %s (%q), want %s %s", o.Kind, o.Code, o.Message, kind, code)
	}
}

func output(t *testing.T, o executor.Outcome) map[string]any {
	t.Helper()
	m, ok := o.Output.(map[string]any)
	if !ok {
		t.Fatalf("output is %T, want a map", o.Output)
	}
	return m
}

func TestHTTPSearchGET(t *testing.T) {
	var rec recorder
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		fmt.Fprint(w, `{"code":200,"data":[{"title":"Cats","url":"https://example.com/cats","n":12345678901234567890}]}`)
	}))
	tool := loopbackTool(t, map[string]string{"JINA_API_KEY": "jina_key_123"}, port)
	o := run(t, tool, jinaCall("search", srv.URL, "/search", "", map[string]any{"query": "cats & dogs?", "session_id": "ignored"}))
	wantKind(t, o, executor.KindSuccess, "")
	got := rec.last(t)
	if got.Method != http.MethodGet || got.Path != "/search" || got.Query.Get("q") != "cats & dogs?" || len(got.Query) != 1 {
		t.Fatalf("upstream saw %s %s", got.Method, got.RequestURI)
	}
	if got.Auth != "Bearer jina_key_123" {
		t.Fatalf("Authorization = %q", got.Auth)
	}
	out := output(t, o)
	if out["status_code"] != 200 || out["content_type"] != "application/json; charset=utf-8" {
		t.Fatalf("output = %v", out)
	}
	body, ok := out["body"].(map[string]any)
	if !ok {
		t.Fatalf("body is %T, want parsed JSON", out["body"])
	}
	item := body["data"].([]any)[0].(map[string]any)
	if item["title"] != "Cats" || item["n"] != json.Number("12345678901234567890") {
		t.Fatalf("body = %v", body)
	}
	// The result card's content is what a worker sees.
	content, status, err := o.ResultContent(1)
	if err != nil || status != protocol.StatusSuccess || !bytes.Contains(content, []byte(`"n":12345678901234567890`)) {
		t.Fatalf("result content %s %s %v", status, content, err)
	}
}

func TestHTTPSearchDefaultPathAndCustomAuthEnv(t *testing.T) {
	var rec recorder
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		fmt.Fprint(w, "plain results")
	}))
	tool := loopbackTool(t, map[string]string{"JINA_API_KEY": "wrong", "MY_KEY": "  mine-456\n"}, port)
	c := callWith(Options{Mode: "search", BaseURL: srv.URL, Method: "GET", AuthEnv: "MY_KEY"}, map[string]any{"query": "q1"})
	o := run(t, tool, c)
	wantKind(t, o, executor.KindSuccess, "")
	got := rec.last(t)
	if got.Path != "/" || got.Query.Get("q") != "q1" || got.Auth != "Bearer mine-456" {
		t.Fatalf("upstream saw %s auth %q", got.RequestURI, got.Auth)
	}
	if b := output(t, o)["body"]; b != "plain results" {
		t.Fatalf("body = %#v, want the text", b)
	}
}

func TestHTTPSearchPOSTWithoutKey(t *testing.T) {
	var rec recorder
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	tool := loopbackTool(t, nil, port) // JINA_API_KEY unset
	o := run(t, tool, jinaCall("search", srv.URL, "/v1/search", "POST", map[string]any{"query": "golang \"nats\""}))
	wantKind(t, o, executor.KindSuccess, "")
	got := rec.last(t)
	if got.Method != http.MethodPost || got.Path != "/v1/search" || len(got.Query) != 0 || got.ContentType != "application/json" {
		t.Fatalf("upstream saw %s %s (%s)", got.Method, got.RequestURI, got.ContentType)
	}
	var body map[string]string
	if err := json.Unmarshal(got.Body, &body); err != nil || body["q"] != `golang "nats"` || len(body) != 1 {
		t.Fatalf("request body = %s (%v)", got.Body, err)
	}
	if got.Auth != "" {
		t.Fatalf("Authorization = %q, want none when the key is unset", got.Auth)
	}
	if output(t, o)["body"].(map[string]any)["ok"] != true {
		t.Fatalf("output = %v", o.Output)
	}
}

func TestHTTPReader(t *testing.T) {
	var rec recorder
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "text/markdown; charset=utf-8")
		fmt.Fprint(w, "# Title\n\nBody")
	}))
	tool := loopbackTool(t, map[string]string{"JINA_API_KEY": "reader-key"}, port)
	o := run(t, tool, jinaCall("reader", srv.URL, "", "", map[string]any{"url": "https://example.com/a/b?x=1&y=two#frag"}))
	wantKind(t, o, executor.KindSuccess, "")
	got := rec.last(t)
	if got.Method != http.MethodGet || got.RequestURI != "/https://example.com/a/b?x=1&y=two" || got.Auth != "Bearer reader-key" {
		t.Fatalf("upstream saw %s %s auth %q", got.Method, got.RequestURI, got.Auth)
	}
	out := output(t, o)
	if out["body"] != "# Title\n\nBody" || out["content_type"] != "text/markdown; charset=utf-8" {
		t.Fatalf("output = %v", out)
	}

	// POST sends the URL as JSON to the base URL.
	o = run(t, tool, jinaCall("reader", srv.URL, "", "POST", map[string]any{"url": "http://example.org/"}))
	wantKind(t, o, executor.KindSuccess, "")
	got = rec.last(t)
	if got.Method != http.MethodPost || got.Path != "/" || string(got.Body) != `{"url":"http://example.org/"}` {
		t.Fatalf("upstream saw %s %s %s", got.Method, got.RequestURI, got.Body)
	}
}

func TestHTTPJSONContentTypeWithBadJSONIsText(t *testing.T) {
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		fmt.Fprint(w, `{"half":`)
	}))
	o := run(t, loopbackTool(t, nil, port), jinaCall("search", srv.URL, "", "", map[string]any{"query": "x"}))
	wantKind(t, o, executor.KindSuccess, "")
	if b := output(t, o)["body"]; b != `{"half":` {
		t.Fatalf("body = %#v", b)
	}
}

func TestHTTPInvalidRequestsAndConfig(t *testing.T) {
	var hits atomic.Int64
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	tool := loopbackTool(t, nil, port)
	invalid := []struct {
		mode  string
		args  map[string]any
		field string
		code  string
	}{
		{"search", map[string]any{}, "arguments.query", protocol.VRequired},
		{"search", map[string]any{"query": nil}, "arguments.query", protocol.VRequired},
		{"search", map[string]any{"query": json.Number("3")}, "arguments.query", protocol.VInvalidType},
		{"search", map[string]any{"query": "  "}, "arguments.query", protocol.VEmpty},
		{"reader", map[string]any{}, "arguments.url", protocol.VRequired},
		{"reader", map[string]any{"url": "ftp://example.com/x"}, "arguments.url", protocol.VInvalidValue},
		{"reader", map[string]any{"url": "/relative/path"}, "arguments.url", protocol.VInvalidValue},
		{"reader", map[string]any{"url": "https://"}, "arguments.url", protocol.VInvalidValue},
		{"reader", map[string]any{"url": false}, "arguments.url", protocol.VInvalidType},
	}
	for _, tc := range invalid {
		o := run(t, tool, jinaCall(tc.mode, srv.URL, "", "", tc.args))
		wantKind(t, o, executor.KindInvalid, executor.CodeInvalidArgs)
		if len(o.Violations) != 1 || o.Violations[0].Field != tc.field || o.Violations[0].Code != tc.code {
			t.Fatalf("%s %v: violations = %+v", tc.mode, tc.args, o.Violations)
		}
	}

	o := run(t, tool, &executor.Call{Arguments: map[string]any{"query": "x"}})
	wantKind(t, o, executor.KindTerminal, executor.CodeToolConfig)
	if o.Message != "options.jina is required" {
		t.Fatalf("message = %q", o.Message)
	}
	for _, j := range []Options{
		{Mode: "crawl", BaseURL: srv.URL},
		{Mode: "search", BaseURL: "ftp://127.0.0.1/"},
		{Mode: "search", BaseURL: "not a url"},
		{Mode: "search", BaseURL: srv.URL, Method: "DELETE"},
	} {
		c := callWith(j, map[string]any{"query": "x", "url": "https://example.com"})
		wantKind(t, run(t, tool, c), executor.KindTerminal, executor.CodeToolConfig)
	}
	if hits.Load() != 0 {
		t.Fatalf("upstream was called %d times", hits.Load())
	}
}

func TestHTTPStatusMapping(t *testing.T) {
	date := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, _ := strconv.Atoi(r.URL.Query().Get("q"))
		switch status {
		case 429:
			w.Header().Set("Retry-After", "7")
		case 430:
			status = 429
			w.Header().Set("Retry-After", date)
		case 431:
			status = 429
			w.Header().Set("Retry-After", "soon")
		case 503:
			w.Header().Set("Retry-After", "2")
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, "status %d body", status)
	}))
	tool := loopbackTool(t, nil, port)
	cases := []struct {
		q          string
		kind       executor.OutcomeKind
		code       string
		l0         string
		retryAfter time.Duration
	}{
		{"200", executor.KindSuccess, "", "", 0},
		{"204", executor.KindSuccess, "", "", 0},
		{"429", executor.KindRetryable, "R-CAP-429", executor.ErrUpstreamUnavailable, 7 * time.Second},
		{"431", executor.KindRetryable, "R-CAP-429", executor.ErrUpstreamUnavailable, 0},
		{"500", executor.KindRetryable, "R-UPSTREAM-500", executor.ErrUpstreamUnavailable, 0},
		{"502", executor.KindRetryable, "R-UPSTREAM-502", executor.ErrUpstreamUnavailable, 0},
		{"503", executor.KindRetryable, "R-UPSTREAM-503", executor.ErrUpstreamUnavailable, 2 * time.Second},
		{"408", executor.KindRetryable, "R-UPSTREAM-408", executor.ErrUpstreamUnavailable, 0},
		{"401", executor.KindTerminal, "A-AUTH-401", executor.ErrAuthFailed, 0},
		{"403", executor.KindTerminal, "A-AUTH-403", executor.ErrAuthFailed, 0},
		{"400", executor.KindTerminal, "I-REQ-400", executor.ErrBadRequest, 0},
		{"404", executor.KindTerminal, "I-REQ-404", executor.ErrBadRequest, 0},
		{"422", executor.KindTerminal, "I-REQ-422", executor.ErrBadRequest, 0},
		{"304", executor.KindTerminal, "P-PRECOND-304", executor.ErrBadRequest, 0},
	}
	for _, tc := range cases {
		o := run(t, tool, jinaCall("search", srv.URL, "", "", map[string]any{"query": tc.q}))
		wantKind(t, o, tc.kind, tc.code)
		if o.RetryAfter != tc.retryAfter {
			t.Errorf("%s: RetryAfter = %v, want %v", tc.q, o.RetryAfter, tc.retryAfter)
		}
		if _, code := o.Status(); code != tc.l0 {
			t.Errorf("%s: L0 error code %q, want %q", tc.q, code, tc.l0)
		}
		if tc.kind != executor.KindSuccess && tc.q != "304" && !strings.Contains(o.Message, " body") {
			t.Errorf("%s: message %q lacks the upstream's body", tc.q, o.Message)
		}
	}
	// Retry-After as an HTTP date.
	o := run(t, tool, jinaCall("search", srv.URL, "", "", map[string]any{"query": "430"}))
	wantKind(t, o, executor.KindRetryable, "R-CAP-429")
	if o.RetryAfter < 58*time.Minute || o.RetryAfter > 61*time.Minute {
		t.Fatalf("RetryAfter from a date an hour ahead = %v", o.RetryAfter)
	}
	// 401 without a key sent says so.
	o = run(t, tool, jinaCall("search", srv.URL, "", "", map[string]any{"query": "401"}))
	if !strings.Contains(o.Hint, "no API key was sent") || !strings.Contains(o.Hint, "$JINA_API_KEY") {
		t.Fatalf("hint = %q", o.Hint)
	}
}

func TestHTTPRetryAfterParsing(t *testing.T) {
	for h, want := range map[string]time.Duration{
		"": 0, "0": 0, "-5": 0, "120": 2 * time.Minute, " 3 ": 3 * time.Second, "abc": 0,
		time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat): 0,
	} {
		if got := retryAfter(h); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", h, got, want)
		}
	}
}

func TestHTTPResponseSizeCap(t *testing.T) {
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("q"))
		chunked := r.URL.Query().Get("chunked") != ""
		if !chunked {
			w.Header().Set("Content-Length", strconv.Itoa(n))
		}
		w.Header().Set("Content-Type", "text/plain")
		for i := 0; i < n; i += 256 {
			w.Write(bytes.Repeat([]byte("x"), min(256, n-i)))
			if chunked {
				w.(http.Flusher).Flush()
			}
		}
	}))
	tool := New(Config{
		AllowedHosts: []string{"127.0.0.1"}, AllowLoopbackPorts: []int{port},
		MaxResponseBytes: 1000, LookupEnv: envMap(nil),
	})
	for _, tc := range []struct {
		n       int
		chunked bool
		ok      bool
	}{{1000, false, true}, {1000, true, true}, {1001, false, false}, {1001, true, false}, {50_000, true, false}, {50_000, false, false}} {
		base := srv.URL
		if tc.chunked {
			base += "/?chunked=1"
		}
		o := run(t, tool, jinaCall("search", base, "", "", map[string]any{"query": strconv.Itoa(tc.n)}))
		if tc.ok {
			wantKind(t, o, executor.KindSuccess, "")
			if len(output(t, o)["body"].(string)) != tc.n {
				t.Fatalf("%d bytes: body truncated", tc.n)
			}
			continue
		}
		wantKind(t, o, executor.KindTerminal, CodeTooLarge)
		if !strings.Contains(o.Message, "1000 bytes") {
			t.Fatalf("message %q does not say the limit", o.Message)
		}
	}
}

// hangingUpstream answers only when its client goes away (or the test ends).
// arrived receives one value per request, once the handler has it.
func hangingUpstream(t *testing.T) (srv *httptest.Server, port int, arrived chan struct{}) {
	t.Helper()
	release := make(chan struct{})
	arrived = make(chan struct{}, 16)
	srv, port = upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	return srv, port, arrived
}

func TestHTTPDeadline(t *testing.T) {
	srv, port, arrived := hangingUpstream(t)
	tool := loopbackTool(t, nil, port)

	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	o := tool.Run(ctx, jinaCall("search", srv.URL, "", "", map[string]any{"query": "slow"}))
	wantKind(t, o, executor.KindRetryable, executor.CodeTimeout)
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %v", el)
	}
	if status, code := o.Status(); status != protocol.StatusTimeout || code != executor.ErrToolTimeout {
		t.Fatalf("L0 = %s %s", status, code)
	}

	// The call's Deadline bounds the request even under a longer context.
	c := jinaCall("search", srv.URL, "", "", map[string]any{"query": "slow"})
	c.Deadline = time.Now().Add(150 * time.Millisecond)
	wantKind(t, run(t, tool, c), executor.KindRetryable, executor.CodeTimeout)

	// Cancellation (not a deadline) is not a timeout.
	ctx2, cancel2 := context.WithCancel(context.Background())
	res := make(chan executor.Outcome, 1)
	for len(arrived) > 0 {
		<-arrived
	}
	go func() { res <- tool.Run(ctx2, jinaCall("search", srv.URL, "", "", map[string]any{"query": "slow"})) }()
	<-arrived // the upstream holds the request
	cancel2()
	wantKind(t, <-res, executor.KindTerminal, executor.CodeCanceled)
}

func TestHTTPHostAllowlist(t *testing.T) {
	var hits atomic.Int64
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	for _, allowed := range [][]string{
		nil, // the default: s.jina.ai and r.jina.ai only
		{"s.jina.ai"},
		{"127.0.0.1:1"},  // wrong port
		{"localhost"},    // names are not resolved for the allowlist
		{"127.0.0.10"},   // different address
		{"127.0.0.1.ai"}, // not a suffix match
	} {
		tool := New(Config{AllowedHosts: allowed, AllowLoopbackPorts: []int{port}, LookupEnv: envMap(nil)})
		o := run(t, tool, jinaCall("search", srv.URL, "", "", map[string]any{"query": "x"}))
		wantKind(t, o, executor.KindTerminal, CodeHostRefused)
		if !strings.Contains(o.Message, "127.0.0.1") {
			t.Fatalf("message %q does not name the host", o.Message)
		}
	}
	if hits.Load() != 0 {
		t.Fatalf("upstream reached %d times", hits.Load())
	}
	// An entry with the right port, in any case, allows it.
	tool := New(Config{AllowedHosts: []string{" 127.0.0.1:" + strconv.Itoa(port)}, AllowLoopbackPorts: []int{port}, LookupEnv: envMap(nil)})
	wantKind(t, run(t, tool, jinaCall("search", srv.URL, "", "", map[string]any{"query": "x"})), executor.KindSuccess, "")

	// Default allowlist matching, without any network.
	def := New(Config{}).(*httpTool)
	for raw, ok := range map[string]bool{
		"https://s.jina.ai/?q=1": true, "https://R.JINA.AI/x": true, "https://s.jina.ai.:443/": true,
		"https://evil.jina.ai/": false, "https://s.jina.ai.evil.com/": false, "ftp://s.jina.ai/": false,
		"https://127.0.0.1/": false, "https://[::1]/": false, "http://169.254.169.254/latest": false,
	} {
		u, _ := url.Parse(raw)
		if err := def.checkURL(u); (err == nil) != ok {
			t.Errorf("checkURL(%s) = %v, want allowed=%v", raw, err, ok)
		}
	}
}

func TestHTTPRedirects(t *testing.T) {
	var hitsB atomic.Int64
	srvB, portB := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hitsB.Add(1)
		fmt.Fprint(w, "from B")
	}))
	srvA, portA := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch q := r.URL.Query().Get("q"); {
		case q == "to-b":
			http.Redirect(w, r, srvB.URL+"/landed", http.StatusFound)
		case q == "to-evil":
			http.Redirect(w, r, "http://evil.example/steal", http.StatusFound)
		case q == "to-metadata":
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusTemporaryRedirect)
		case q == "to-file":
			http.Redirect(w, r, "file:///etc/passwd", http.StatusFound)
		case strings.HasPrefix(q, "hop"):
			n, _ := strconv.Atoi(strings.TrimPrefix(q, "hop"))
			if n == 0 {
				fmt.Fprint(w, "done")
				return
			}
			http.Redirect(w, r, fmt.Sprintf("/?q=hop%d", n-1), http.StatusFound)
		}
	}))

	// B's port is not allowed: the dial guard refuses the redirect.
	tool := loopbackTool(t, nil, portA)
	o := run(t, tool, jinaCall("search", srvA.URL, "", "", map[string]any{"query": "to-b"}))
	wantKind(t, o, executor.KindTerminal, CodeAddrRefused)
	if !strings.Contains(o.Message, "127.0.0.1:"+strconv.Itoa(portB)) || !strings.Contains(o.Message, "loopback") {
		t.Fatalf("message = %q", o.Message)
	}
	if hitsB.Load() != 0 {
		t.Fatal("the guarded port was reached")
	}

	for q, host := range map[string]string{"to-evil": "evil.example", "to-metadata": "169.254.169.254", "to-file": `"file"`} {
		o = run(t, tool, jinaCall("search", srvA.URL, "", "", map[string]any{"query": q}))
		wantKind(t, o, executor.KindTerminal, CodeHostRefused)
		if !strings.Contains(o.Message, host) || !strings.Contains(o.Message, "redirect refused") {
			t.Fatalf("%s: message = %q", q, o.Message)
		}
	}

	// Both ports allowed: the redirect is followed.
	both := loopbackTool(t, nil, portA, portB)
	o = run(t, both, jinaCall("search", srvA.URL, "", "", map[string]any{"query": "to-b"}))
	wantKind(t, o, executor.KindSuccess, "")
	if output(t, o)["body"] != "from B" || hitsB.Load() != 1 {
		t.Fatalf("output = %v", o.Output)
	}

	// At most 5 redirects.
	wantKind(t, run(t, tool, jinaCall("search", srvA.URL, "", "", map[string]any{"query": "hop5"})), executor.KindSuccess, "")
	wantKind(t, run(t, tool, jinaCall("search", srvA.URL, "", "", map[string]any{"query": "hop6"})), executor.KindTerminal, CodeRedirects)
}

func TestHTTPDialGuardRefusesLoopbackByDefault(t *testing.T) {
	var hits atomic.Int64
	srv, _ := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	tool := loopbackTool(t, nil) // host allowed, port not
	o := run(t, tool, jinaCall("search", srv.URL, "", "", map[string]any{"query": "x"}))
	wantKind(t, o, executor.KindTerminal, CodeAddrRefused)
	if hits.Load() != 0 {
		t.Fatal("loopback reached")
	}
	if _, code := o.Status(); code != executor.ErrBadRequest {
		t.Fatalf("L0 code = %s", code)
	}
}

func TestHTTPDialGuardCheck(t *testing.T) {
	g := newDialGuard([]int{8080})
	refused := []string{
		"127.0.0.1", "127.1.2.3", "10.0.0.1", "172.16.5.4", "172.31.255.255", "192.168.1.1",
		"169.254.169.254", "169.254.0.1", "100.64.0.1", "100.127.255.254", "0.0.0.0", "0.1.2.3",
		"224.0.0.1", "239.255.255.250", "255.255.255.255", "240.0.0.1", "198.18.0.1",
		"::", "::1", "fe80::1", "fe80::1%eth0", "fc00::1", "fd12:3456::1", "ff02::1", "fec0::1",
		"::ffff:10.0.0.1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:100.64.0.1",
		"::10.0.0.1", "64:ff9b::10.0.0.1", "64:ff9b::a9fe:a9fe", "2002:a00:1::1", "2002:7f00:1::",
	}
	for _, s := range refused {
		ip := netip.MustParseAddr(s)
		if r := checkIP(ip); r == "" {
			t.Errorf("checkIP(%s) allowed", s)
		}
		err := g.check(netip.AddrPortFrom(ip, 443))
		if _, ok := err.(*blockedAddrError); !ok {
			t.Errorf("check(%s:443) = %v", s, err)
		}
	}
	for _, s := range []string{"93.184.216.34", "8.8.8.8", "1.1.1.1", "100.63.255.255", "100.128.0.1", "172.32.0.1", "2606:2800:220:1:248:1893:25c8:1946", "64:ff9b::808:808", "2002:808:808::1"} {
		if r := checkIP(netip.MustParseAddr(s)); r != "" {
			t.Errorf("checkIP(%s) refused: %s", s, r)
		}
	}
	// Loopback on an allowed port only; never other non-public ranges.
	for s, ok := range map[string]bool{
		"127.0.0.1:8080": true, "[::1]:8080": true, "[::ffff:127.0.0.1]:8080": true,
		"127.0.0.1:8081": false, "10.0.0.1:8080": false, "[fe80::1]:8080": false, "169.254.169.254:8080": false,
	} {
		err := g.control("tcp", s, nil)
		if (err == nil) != ok {
			t.Errorf("control(tcp, %s) = %v, want allowed=%v", s, err, ok)
		}
	}
	if err := g.control("udp", "93.184.216.34:53", nil); err == nil {
		t.Error("udp dial allowed")
	}
	if err := g.control("tcp", "not-an-address", nil); err == nil {
		t.Error("unparseable address allowed")
	}
	if err := g.control("tcp4", "93.184.216.34:443", nil); err != nil {
		t.Errorf("public address refused: %v", err)
	}
}

func TestHTTPIgnoresProxyEnvironment(t *testing.T) {
	var proxied atomic.Int64
	proxy, proxyPort := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		w.WriteHeader(http.StatusBadGateway)
	}))
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
		t.Setenv(k, proxy.URL)
	}
	t.Setenv("NO_PROXY", "")
	t.Setenv("no_proxy", "")
	var rec recorder
	_, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		fmt.Fprint(w, "direct")
	}))
	tool := New(Config{
		AllowedHosts:       []string{"upstream.test"},
		AllowLoopbackPorts: []int{port, proxyPort},
		LookupEnv:          envMap(nil),
	}).(*httpTool)
	tr := tool.client.Transport.(*http.Transport)
	if tr.Proxy != nil {
		t.Fatal("the transport has a proxy function")
	}
	// A name that is not "localhost" nor a loopback literal, so that an
	// environment proxy would be used if the transport consulted it; it
	// "resolves" to the loopback upstream, still through the dial guard.
	guarded := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, p, err := net.SplitHostPort(addr)
		if err != nil || host != "upstream.test" {
			return nil, fmt.Errorf("unexpected dial to %q", addr)
		}
		return guarded(ctx, network, net.JoinHostPort("127.0.0.1", p))
	}
	o := run(t, tool, jinaCall("search", fmt.Sprintf("http://upstream.test:%d", port), "", "", map[string]any{"query": "x"}))
	wantKind(t, o, executor.KindSuccess, "")
	if output(t, o)["body"] != "direct" || proxied.Load() != 0 || len(rec.all()) != 1 {
		t.Fatalf("output %v, proxy hits %d", o.Output, proxied.Load())
	}
}

func TestHTTPNetworkErrors(t *testing.T) {
	// Connection refused: a port nobody listens on any more.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	tool := loopbackTool(t, nil, deadPort)
	o := run(t, tool, jinaCall("search", fmt.Sprintf("http://127.0.0.1:%d", deadPort), "", "", map[string]any{"query": "x"}))
	wantKind(t, o, executor.KindRetryable, CodeNetwork)
	if !strings.Contains(o.Message, "refused") {
		t.Fatalf("message = %q", o.Message)
	}

	// Connection reset mid-request.
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			conn.Close()
		}
	}))
	o = run(t, loopbackTool(t, nil, port), jinaCall("search", srv.URL, "", "", map[string]any{"query": "x"}))
	wantKind(t, o, executor.KindRetryable, CodeNetwork)
	if _, code := o.Status(); code != executor.ErrUpstreamUnavailable {
		t.Fatalf("L0 code %s", code)
	}
}

// TestHTTPCanaryKeyNeverLeaks plants an API key, has the upstream reflect
// the request's headers every way it can, and checks the key appears in no
// outcome, result content or log line.
func TestHTTPCanaryKeyNeverLeaks(t *testing.T) {
	const canary = `sk-CANARY-9f2e<"&>+/= 7a61`
	forms := []string{canary, url.QueryEscape(canary), url.PathEscape(canary), "CANARY-9f2e"}
	if esc, _ := json.Marshal(canary); true {
		forms = append(forms, string(esc[1:len(esc)-1]))
	}
	var received atomic.Int64
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		if auth == "Bearer "+canary {
			received.Add(1)
		}
		headers, _ := json.Marshal(r.Header)
		mode := r.URL.Query().Get("q")
		switch mode {
		case "json":
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"headers": r.Header, "auth": auth, auth: []any{auth, 1}})
		case "text":
			fmt.Fprintf(w, "you sent %s\n%s", auth, headers)
		case "ctype":
			w.Header().Set("Content-Type", "text/plain; key="+strings.TrimPrefix(auth, "Bearer "))
			fmt.Fprint(w, "ok")
		case "redirect":
			http.Redirect(w, r, "http://evil.example/?k="+url.QueryEscape(auth), http.StatusFound)
		case "clip":
			// The key straddles the cut of the quoted error body.
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, strings.Repeat("a", 485)+auth+strings.Repeat("b", 100))
		case "oversize":
			fmt.Fprint(w, strings.Repeat(auth, 10_000))
		default:
			code, _ := strconv.Atoi(mode)
			w.Header().Set("Retry-After", auth)
			w.Header().Set("WWW-Authenticate", auth)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error":"bad key %s","echo":%s}`, auth, headers)
		}
	}))
	var logs bytes.Buffer
	tool := New(Config{
		AllowedHosts:       []string{"127.0.0.1"},
		AllowLoopbackPorts: []int{port},
		LookupEnv:          envMap(map[string]string{"JINA_API_KEY": canary}),
		MaxResponseBytes:   64 << 10,
		Logger:             slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	modes := []string{"json", "text", "ctype", "redirect", "clip", "oversize", "400", "401", "403", "404", "429", "500", "503"}
	redactedSeen := 0
	for _, mode := range modes {
		o := run(t, tool, jinaCall("search", srv.URL, "", "", map[string]any{"query": mode}))
		if mode == "json" || mode == "text" || mode == "ctype" {
			wantKind(t, o, executor.KindSuccess, "")
		} else if o.Kind == executor.KindSuccess {
			t.Fatalf("%s: unexpected success", mode)
		}
		marshaled, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		content, _, err := o.ResultContent(1)
		if err != nil {
			t.Fatal(err)
		}
		all := string(marshaled) + "\n" + string(content) + "\n" + fmt.Sprintf("%+v", o)
		for _, f := range forms {
			if strings.Contains(all, f) {
				t.Fatalf("%s: the key (as %q) leaked: %s", mode, f, all)
			}
		}
		if strings.Contains(all, httpRedacted) {
			redactedSeen++
		}
	}
	if received.Load() == 0 {
		t.Fatal("the upstream never received the key: the test proves nothing")
	}
	if redactedSeen < 5 {
		t.Fatalf("only %d outcomes carried [REDACTED]: the reflection paths were not exercised", redactedSeen)
	}
	if logs.Len() == 0 {
		t.Fatal("no logs were written")
	}
	for _, f := range forms {
		if strings.Contains(logs.String(), f) {
			t.Fatalf("the key leaked into logs: %s", logs.String())
		}
	}
}

func TestHTTPScrubbing(t *testing.T) {
	forms := httpSecretForms("abc")
	if forms != nil {
		t.Fatalf("short keys are not scrubbed, got %v", forms)
	}
	forms = httpSecretForms("12345678")
	v := scrubValue(map[string]any{"n": json.Number("12345678"), "m": json.Number("42"), "l": []any{"x12345678y"}, "12345678": true}, forms)
	want := map[string]any{"n": httpRedacted, "m": json.Number("42"), "l": []any{"x" + httpRedacted + "y"}, httpRedacted: true}
	if fmt.Sprint(v) != fmt.Sprint(want) {
		t.Fatalf("scrubbed = %v", v)
	}
}

// TestHTTPSendsTheIdempotencyKey: the call's key goes upstream as
// Idempotency-Key, the same on a second run of the call (a retry or a
// redelivery); a call without one sends none.
func TestHTTPSendsTheIdempotencyKey(t *testing.T) {
	var rec recorder
	srv, port := upstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		fmt.Fprint(w, `{}`)
	}))
	tool := loopbackTool(t, nil, port)
	key := protocol.IdempotencyKey("proj", "turn-1", "call-1")
	for range 2 {
		c := jinaCall("search", srv.URL, "/search", "POST", map[string]any{"query": "q"})
		c.IdempotencyKey = key
		wantKind(t, run(t, tool, c), executor.KindSuccess, "")
	}
	wantKind(t, run(t, tool, jinaCall("search", srv.URL, "/search", "", map[string]any{"query": "q"})), executor.KindSuccess, "")
	all := rec.all()
	if len(all) != 3 || all[0].IdempotencyKey != key || all[1].IdempotencyKey != key || all[2].IdempotencyKey != "" {
		t.Fatalf("Idempotency-Key headers = %q, %q, %q; want %q twice then none", all[0].IdempotencyKey, all[1].IdempotencyKey, all[2].IdempotencyKey, key)
	}
}
