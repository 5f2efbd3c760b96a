package httpapi_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
)

func decode(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &m), rec.Body.String())
	return m
}

// TestErrorIsAProblem pins the body: RFC 9457 members, the code and
// violations as extension members, and the deprecated error object with
// the values of earlier releases.
func TestErrorIsAProblem(t *testing.T) {
	rec := httptest.NewRecorder()
	var vs protocol.Violations
	vs.Add("limit", protocol.VInvalidValue, "must be at most %d", 1000)
	httpapi.Error(rec, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid query parameters", Violations: vs, Seq: 7})
	require.Equal(t, 400, rec.Code)
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	require.JSONEq(t, `{
		"type": "https://cgledger.dev/problems/bad_request", "title": "Bad request", "status": 400,
		"detail": "invalid query parameters", "code": "bad_request",
		"violations": [{"field": "limit", "code": "invalid_value", "message": "must be at most 1000"}],
		"rejection_seq": 7,
		"error": {"code": "bad_request", "message": "invalid query parameters",
			"violations": [{"field": "limit", "code": "invalid_value", "message": "must be at most 1000"}], "rejection_seq": 7}
	}`, rec.Body.String())

	rec = httptest.NewRecorder()
	httpapi.Error(rec, &protocol.Error{Code: protocol.CodeNotFound, Message: "turn t has no entries"})
	require.JSONEq(t, `{"type": "https://cgledger.dev/problems/not_found", "title": "Not found", "status": 404,
		"detail": "turn t has no entries", "code": "not_found", "error": {"code": "not_found", "message": "turn t has no entries"}}`, rec.Body.String())

	rec = httptest.NewRecorder()
	httpapi.Error(rec, errors.New("disk on fire"))
	require.Equal(t, 500, rec.Code)
	m := decode(t, rec)
	require.Equal(t, "internal", m["code"])
	require.Equal(t, "Internal error", m["title"])
	require.Equal(t, "disk on fire", m["detail"])

	// A request naming another project than its URL's is the caller's
	// fault, as forbidden is over NATS.
	rec = httptest.NewRecorder()
	httpapi.Error(rec, &protocol.Error{Code: protocol.CodeForbidden, Message: "tool definition names another project"})
	require.Equal(t, 403, rec.Code)
	require.Equal(t, "Forbidden", decode(t, rec)["title"])

	// Codes the audit API has no status for stay 500, as before.
	rec = httptest.NewRecorder()
	httpapi.Error(rec, &protocol.Error{Code: protocol.CodeConflict, Message: "x"})
	require.Equal(t, 500, rec.Code)
	require.Equal(t, "Conflict", decode(t, rec)["title"])
}

func TestNoRouteAndLimit(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /a/{x}", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("POST /a/{x}", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/a/", httpapi.Fallback(mux, "/a/"))
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"DELETE", "/a/1", 405, "GET, HEAD, POST"},
		{"GET", "/a/1/2", 404, ""},
		{"PATCH", "/a/", 404, ""},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		require.Equal(t, tc.status, rec.Code, tc.path)
		require.Equal(t, tc.allow, rec.Header().Get("Allow"))
		require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"))
		m := decode(t, rec)
		if tc.status == 405 {
			require.Equal(t, "method_not_allowed", m["code"])
		} else {
			require.Equal(t, "no such endpoint: "+tc.method+" "+tc.path, m["detail"])
		}
	}

	for q, want := range map[string]struct {
		limit int
		bad   bool
	}{
		"": {100, false}, "limit=0": {100, false}, "limit=7": {7, false}, "limit=1000": {1000, false},
		"limit=1001": {1000, true}, "limit=-1": {100, true}, "limit=x": {100, true},
	} {
		var vs protocol.Violations
		got := httpapi.Limit(httptest.NewRequest("GET", "/?"+q, nil), &vs)
		require.Equal(t, want.limit, got, q)
		require.Equal(t, want.bad, len(vs) == 1, q)
	}
}

// TestAuthRefusalsAreProblems checks the authentication policy answers its
// refusals (400, 401, 403) as problem details, leaves the OpenAPI document
// open, and needs a credential of every project for GET /v1/projects.
func TestAuthRefusalsAreProblems(t *testing.T) {
	k, err := auth.LoadOrCreateKeys(filepath.Join(t.TempDir(), "keys"))
	require.NoError(t, err)
	is, err := k.Issuer()
	require.NoError(t, err)
	v, err := k.Verifier()
	require.NoError(t, err)
	now := time.Now()
	pol := &httpapi.Policy{Verifier: v, Now: func() time.Time { return now }}
	h := pol.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	tok := func(g auth.Grant) string {
		c, err := is.Issue(g, time.Hour, now)
		require.NoError(t, err)
		return c.JWT
	}
	for _, tc := range []struct {
		path, token string
		status      int
		code        string
	}{
		{"/v1/projects", "", 401, "unauthenticated"},
		{"/v1/projects", tok(auth.Grant{Role: auth.RoleAuditor, Project: "A"}), 403, "forbidden"},
		{"/v1/projects", tok(auth.Grant{Role: auth.RoleAuditor, Project: "*"}), http.StatusTeapot, ""},
		{"/v1/projects/A/../B/calls", tok(auth.Grant{Role: auth.RoleAuditor, Project: "A"}), 400, "bad_request"},
		{"/v1/openapi.json", "", http.StatusTeapot, ""},
	} {
		rq := httptest.NewRequest("GET", tc.path, nil)
		if tc.token != "" {
			rq.Header.Set("Authorization", "Bearer "+tc.token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, rq)
		require.Equal(t, tc.status, rec.Code, tc.path)
		if tc.code == "" {
			continue
		}
		require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"))
		m := decode(t, rec)
		require.Equal(t, tc.code, m["code"])
		require.Equal(t, problem.TypeBase+tc.code, m["type"])
		require.Equal(t, float64(tc.status), m["status"])
		legacy := m["error"].(map[string]any)
		require.Equal(t, tc.code, legacy["code"], "the deprecated error member")
		require.Equal(t, m["detail"], legacy["message"])
		if tc.status == 401 {
			require.Equal(t, `Bearer realm="cgledger"`, rec.Header().Get("WWW-Authenticate"))
		}
	}
}
