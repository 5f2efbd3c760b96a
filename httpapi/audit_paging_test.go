package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
)

// walkPages follows next_cursor from base (which has a query string) with
// the given limit and returns every page's items, requiring each page to be
// at most limit long and the last to have no cursor.
func walkPages[T any](t *testing.T, base string, limit string) []T {
	t.Helper()
	var all []T
	cursor := ""
	for range 1000 {
		u := base + "&limit=" + limit
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		var page projector.Page[T]
		require.Equal(t, 200, getJSON(t, u, &page))
		n, err := strconv.Atoi(limit)
		require.NoError(t, err)
		if n == 0 {
			n = projector.DefaultLimit
		}
		require.LessOrEqual(t, len(page.Items), n)
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			return all
		}
		cursor = page.NextCursor
	}
	t.Fatal("paging does not end")
	return nil
}

func problemOf(t *testing.T, method, u string, status int) (*http.Response, problem.Details) {
	t.Helper()
	rq, err := http.NewRequest(method, u, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(rq)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, status, resp.StatusCode, string(body))
	require.Equal(t, problem.ContentType, resp.Header.Get("Content-Type"))
	var p problem.Details
	require.NoError(t, json.Unmarshal(body, &p), string(body))
	require.Equal(t, status, p.Status)
	require.Equal(t, problem.TypeBase+p.Code, p.Type)
	require.NotEmpty(t, p.Title)
	require.Equal(t, p.Code, p.Error.Code, "the deprecated error member")
	require.Equal(t, p.Detail, p.Error.Message)
	require.Equal(t, p.Violations, p.Error.Violations)
	return resp, p
}

// TestHTTPListsPageAlike checks that every list of the audit API pages the
// same way (limit, cursor, items, next_cursor absent on the last page) and
// that pages of any size add up to the whole list.
func TestHTTPListsPageAlike(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 12)
	ctx := ledgertest.Ctx(t)
	for _, name := range []string{"alpha", "beta", "gamma"} {
		_, err := e.L.RegisterToolYAML(ctx, "proj", []byte("tool_name: "+name+"\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo\nafter_execution: suspend\n"))
		require.NoError(t, err)
	}
	_, err := e.L.RegisterToolYAML(ctx, "proj", []byte("tool_name: alpha\ndescription: v2\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo\nafter_execution: suspend\n"))
	require.NoError(t, err)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	require.NoError(t, newProjector(t, e, s, 16).CatchUp(ctx))
	q := projector.NewQueries(s)
	srv := httptest.NewServer(httpapi.Audit(q, httpapi.AuditConfig{}))
	t.Cleanup(srv.Close)
	base := srv.URL + "/v1/projects/proj"

	cards, err := q.TurnCards("proj", "turn-special", projector.AsOf{})
	require.NoError(t, err)
	require.Greater(t, len(cards.Items), 2)
	tools, err := q.Tools("proj", projector.AsOf{})
	require.NoError(t, err)
	require.Len(t, tools.Items, 3)
	for _, limit := range []string{"1", "2", "0"} {
		gotCards := walkPages[projector.CardVersion](t, base+"/turns/turn-special/cards?x=", limit)
		require.Equal(t, len(cards.Items), len(gotCards), "limit %s", limit)
		for i := range gotCards {
			require.Equal(t, cards.Items[i].Seq, gotCards[i].Seq)
		}
		gotTools := walkPages[projector.ToolVersion](t, base+"/tools?x=", limit)
		require.Equal(t, tools.Items, gotTools, "limit %s", limit)
		projects := walkPages[projector.ProjectInfo](t, srv.URL+"/v1/projects?x=", limit)
		require.Len(t, projects, 1)
		require.Equal(t, "proj", projects[0].ProjectID)
		calls := walkPages[projector.CallState](t, base+"/calls?x=", limit)
		require.NotEmpty(t, calls)
		inbox := walkPages[projector.InboxEntry](t, base+"/agents/alice/inbox?x=", limit)
		require.NotEmpty(t, inbox)
	}
	// As of alpha's first version, before the other tools: one tool (that
	// version), no cursor.
	alpha, err := q.Tool("proj", "alpha", projector.AsOf{})
	require.NoError(t, err)
	var page projector.Page[projector.ToolVersion]
	require.Equal(t, 200, getJSON(t, base+"/tools?limit=1&as_of_seq="+itoa(alpha.Versions[0].Seq), &page))
	require.Equal(t, []projector.ToolVersion{alpha.Versions[0]}, page.Items)
	require.Empty(t, page.NextCursor)

	for _, u := range []string{"/v1/projects", "/v1/projects/proj/tools", "/v1/projects/proj/turns/turn-special/cards", "/v1/projects/proj/calls", "/v1/skips"} {
		_, p := problemOf(t, "GET", srv.URL+u+"?limit=1001&cursor=bm9wZQ", http.StatusBadRequest)
		require.Equal(t, "bad_request", p.Code, u)
		fields := []string{}
		for _, v := range p.Violations {
			fields = append(fields, v.Field)
		}
		require.Contains(t, fields, "limit", u)
	}
	for _, u := range []string{"/v1/projects", "/v1/projects/proj/tools", "/v1/projects/proj/turns/turn-special/cards"} {
		_, p := problemOf(t, "GET", srv.URL+u+"?cursor=bm9wZQ", http.StatusBadRequest)
		require.Equal(t, "cursor", p.Violations[0].Field, u)
	}
}

// TestHTTPErrorsAreProblems checks the audit API's errors are RFC 9457
// problem details that keep the deprecated error member, and that a
// request no route serves is 404, or 405 with Allow.
func TestHTTPErrorsAreProblems(t *testing.T) {
	_, _, q := scenarioViews(t)
	srv := httptest.NewServer(httpapi.Audit(q, httpapi.AuditConfig{}))
	t.Cleanup(srv.Close)

	_, p := problemOf(t, "GET", srv.URL+"/v1/projects/proj/calls?as_of_seq=abc&status=meh", http.StatusBadRequest)
	require.Equal(t, "bad_request", p.Code)
	require.Equal(t, "Bad request", p.Title)
	require.Len(t, p.Violations, 2)
	// A repeated parameter is refused, each named, not resolved by a guess.
	_, p = problemOf(t, "GET", srv.URL+"/v1/projects/proj/calls?as_of_seq=4&as_of_seq=9&tool=a&tool=b&limit=2", http.StatusBadRequest)
	require.Equal(t, []string{"as_of_seq", "tool"}, []string{p.Violations[0].Field, p.Violations[1].Field})
	require.Len(t, p.Violations, 2)
	_, p = problemOf(t, "GET", srv.URL+"/v1/projects/proj/turns/nope/timeline", http.StatusNotFound)
	require.Equal(t, "not_found", p.Code)
	require.Contains(t, p.Detail, "turn nope has no entries")
	_, p = problemOf(t, "GET", srv.URL+"/v1/verify", http.StatusNotFound)
	require.Contains(t, p.Detail, "not configured")
	_, p = problemOf(t, "GET", srv.URL+"/v1/nothing/here", http.StatusNotFound)
	require.Equal(t, "no such endpoint: GET /v1/nothing/here", p.Detail)
	// /v1/export is served next to this handler (cmd/cgledger): its
	// path is known, so another method is a 405, and GET here a 404.
	_, p = problemOf(t, "GET", srv.URL+"/v1/export", http.StatusNotFound)
	require.Contains(t, p.Detail, "not served by this process")
	for _, tc := range []struct{ method, path string }{
		{"POST", "/v1/projects"},
		{"DELETE", "/v1/digest"},
		{"PUT", "/v1/projects/proj/turns/t/timeline"},
		{"POST", "/v1/export"},
		{"POST", "/v1/openapi.json"},
	} {
		resp, p := problemOf(t, tc.method, srv.URL+tc.path, http.StatusMethodNotAllowed)
		require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"), tc.path)
		require.Equal(t, "method_not_allowed", p.Code)
		require.True(t, strings.HasPrefix(p.Detail, tc.method+" is not served for "+tc.path), p.Detail)
	}

	// The document is served here too (serve mounts this handler at /v1/).
	resp, err := http.Get(srv.URL + "/v1/openapi.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var doc map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	require.Contains(t, doc, "openapi")
}

// TestHTTPListsListEveryParameterViolation: a list's 400 names every
// parameter problem at once (docs/audit-api.md), a cursor that is not one of
// the list's included, whichever other parameter is wrong too.
func TestHTTPListsListEveryParameterViolation(t *testing.T) {
	_, _, q := scenarioViews(t)
	srv := httptest.NewServer(httpapi.Audit(q, httpapi.AuditConfig{}))
	t.Cleanup(srv.Close)
	lists := []string{"/v1/projects?", "/v1/projects/proj/turns/t1/cards?", "/v1/projects/proj/calls?",
		"/v1/projects/proj/calls?status=success&", "/v1/projects/proj/agents/a1/inbox?",
		"/v1/projects/proj/agents/a1/inbox?state=pending&", "/v1/projects/proj/tools?",
		"/v1/unrecognized?", "/v1/skipped?", "/v1/skips?"}
	for _, list := range lists {
		// "zz" is not base64 of anything; AAAAAAAAAAAA decodes, to no
		// list's cursor.
		for _, cursor := range []string{"zz", "AAAAAAAAAAAA"} {
			_, p := problemOf(t, "GET", srv.URL+list+"limit=5000&cursor="+cursor, http.StatusBadRequest)
			require.ElementsMatch(t, []string{"limit", "cursor"}, violationFields(p), list+cursor)
			_, p = problemOf(t, "GET", srv.URL+list+"as_of=yesterday&as_of_seq=x&limit=-1&cursor="+cursor, http.StatusBadRequest)
			require.ElementsMatch(t, []string{"as_of", "as_of_seq", "limit", "cursor"}, violationFields(p), list+cursor)
		}
	}
	// A parameter the cursor's list depends on is wrong: the cursor is
	// still judged as far as it can be.
	_, p := problemOf(t, "GET", srv.URL+"/v1/projects/proj/agents/a1/inbox?state=bogus&limit=5000&cursor=zz", http.StatusBadRequest)
	require.ElementsMatch(t, []string{"state", "limit", "cursor"}, violationFields(p))
	_, p = problemOf(t, "GET", srv.URL+"/v1/projects/proj/calls?state=bogus&limit=5000&cursor=zz", http.StatusBadRequest)
	require.ElementsMatch(t, []string{"state", "limit", "cursor"}, violationFields(p))
	// Path ids are parameters too.
	_, p = problemOf(t, "GET", srv.URL+"/v1/projects/proj/agents/a%20b/inbox?limit=5000", http.StatusBadRequest)
	require.ElementsMatch(t, []string{"agent_id", "limit"}, violationFields(p))
	_, p = problemOf(t, "GET", srv.URL+"/v1/projects/a%20b/turns/t1/cards?limit=5000", http.StatusBadRequest)
	require.ElementsMatch(t, []string{"project_id", "limit"}, violationFields(p))
}

func violationFields(p problem.Details) []string {
	var out []string
	for _, v := range p.Violations {
		out = append(out, v.Field)
	}
	return out
}
