package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/protocol"
)

// fakeRegistry holds registered tools in memory.
type fakeRegistry struct{ tools []protocol.StoredTool }

func (f *fakeRegistry) RegisterToolYAML(context.Context, string, []byte) (protocol.RegisterResult, error) {
	var vs protocol.Violations
	vs.Add("tool.tool_name", protocol.VRequired, "is required")
	return protocol.RegisterResult{}, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid tool definition", Violations: vs, Seq: 42}
}

func (f *fakeRegistry) GetTool(_ context.Context, project, tool string) (*protocol.StoredTool, error) {
	for _, t := range f.tools {
		if t.Definition.ToolName == tool {
			return &t, nil
		}
	}
	return nil, &protocol.Error{Code: protocol.CodeNotFound, Message: "tool " + tool + " is not registered in project " + project}
}

func (f *fakeRegistry) ListTools(context.Context, string) ([]protocol.StoredTool, error) {
	return f.tools, nil
}

func registryServer(t *testing.T, registered ...string) *httptest.Server {
	t.Helper()
	f := &fakeRegistry{}
	for i, n := range registered {
		f.tools = append(f.tools, protocol.StoredTool{Seq: uint64(10 + i), Definition: protocol.ToolDefinition{ProjectID: "p", ToolName: n}})
	}
	srv := httptest.NewServer(httpapi.NewRegistry(f, httpapi.RegistryConfig{}, executor.EchoDefinition, executor.SleepDefinition))
	t.Cleanup(srv.Close)
	return srv
}

func fetch(t *testing.T, method, u string, out any) *http.Response {
	t.Helper()
	rq, err := http.NewRequest(method, u, strings.NewReader("tool_name: x"))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(rq)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	want := "application/json"
	if resp.StatusCode >= 400 {
		want = problem.ContentType
	}
	require.Equal(t, want, resp.Header.Get("Content-Type"), string(b))
	if out != nil {
		require.NoError(t, json.Unmarshal(b, out), string(b))
	}
	return resp
}

func names(ts []executor.RegistryTool) []string {
	var out []string
	for _, t := range ts {
		n := t.Definition.ToolName
		if t.Builtin {
			n += "*"
		}
		out = append(out, n)
	}
	return out
}

// TestRegistryListPages checks the registry list pages like the audit API's
// lists (limit, cursor, items, next_cursor absent on the last page), keeps
// tools as an alias of items, and lists the built-ins a project did not
// override after its own tools.
func TestRegistryListPages(t *testing.T) {
	srv := registryServer(t, "alpha", "echo", "zeta", "beta")
	var page executor.RegistryPage
	require.Equal(t, 200, fetch(t, "GET", srv.URL+"/projects/p/tools", &page).StatusCode)
	require.Equal(t, "p", page.ProjectID)
	require.Equal(t, []string{"alpha", "beta", "echo", "zeta", "sleep*"}, names(page.Items), "registered by name, then the built-ins not overridden")
	require.Equal(t, page.Items, page.Tools, "tools is items (deprecated)")
	require.Empty(t, page.NextCursor)

	for limit := 1; limit <= 5; limit++ {
		var got []string
		cursor := ""
		for {
			var p executor.RegistryPage
			u := fmt.Sprintf("%s/projects/p/tools?limit=%d&cursor=%s", srv.URL, limit, url.QueryEscape(cursor))
			require.Equal(t, 200, fetch(t, "GET", u, &p).StatusCode)
			require.LessOrEqual(t, len(p.Items), limit)
			require.Equal(t, p.Items, p.Tools)
			got = append(got, names(p.Items)...)
			if p.NextCursor == "" {
				break
			}
			cursor = p.NextCursor
		}
		require.Equal(t, names(page.Items), got, "limit %d", limit)
	}

	// A project with no tools of its own: the built-ins, one page, no
	// next_cursor member at all.
	var raw map[string]json.RawMessage
	require.Equal(t, 200, fetch(t, "GET", registryServer(t).URL+"/projects/q/tools", &raw).StatusCode)
	require.NotContains(t, raw, "next_cursor", "absent on the last page")
	var builtins executor.RegistryPage
	require.NoError(t, json.Unmarshal(mustJSON(t, raw), &builtins))
	require.Equal(t, []string{"echo*", "sleep*"}, names(builtins.Items))
	require.Equal(t, uint64(0), builtins.Items[0].Seq)

	var p problem.Details
	require.Equal(t, 400, fetch(t, "GET", srv.URL+"/projects/p/tools?limit=1001&cursor=%21", &p).StatusCode)
	require.Equal(t, "bad_request", p.Code)
	require.Len(t, p.Violations, 2, "limit and cursor at once")
}

// TestRegistryErrorsAreProblems checks the registry's errors are problem
// details (with the rejection entry's sequence) and that it answers 404 or
// 405 with Allow for what it does not serve.
func TestRegistryErrorsAreProblems(t *testing.T) {
	srv := registryServer(t, "alpha")
	var p problem.Details
	require.Equal(t, 400, fetch(t, "POST", srv.URL+"/projects/p/tools", &p).StatusCode)
	require.Equal(t, "bad_request", p.Code)
	require.Equal(t, uint64(42), p.RejectionSeq)
	require.Equal(t, uint64(42), p.Error.RejectionSeq, "the deprecated member keeps rejection_seq")
	require.Equal(t, "tool.tool_name", p.Violations[0].Field)

	p = problem.Details{}
	require.Equal(t, 404, fetch(t, "GET", srv.URL+"/projects/p/tools/nope", &p).StatusCode)
	require.Equal(t, "not_found", p.Code)
	var tool executor.RegistryTool
	require.Equal(t, 200, fetch(t, "GET", srv.URL+"/projects/p/tools/sleep", &tool).StatusCode)
	require.True(t, tool.Builtin)
	require.Equal(t, "p", tool.Definition.ProjectID)
	tool = executor.RegistryTool{}
	require.Equal(t, 200, fetch(t, "GET", srv.URL+"/projects/p/tools/alpha", &tool).StatusCode)
	require.False(t, tool.Builtin)
	require.Equal(t, uint64(10), tool.Seq)

	for _, tc := range []struct{ method, path, allow string }{
		{"PUT", "/projects/p/tools", "GET, HEAD, POST"},
		{"DELETE", "/projects/p/tools/alpha", "GET, HEAD"},
	} {
		p = problem.Details{}
		resp := fetch(t, tc.method, srv.URL+tc.path, &p)
		require.Equal(t, 405, resp.StatusCode)
		require.Equal(t, tc.allow, resp.Header.Get("Allow"))
		require.Equal(t, "method_not_allowed", p.Code)
	}
	p = problem.Details{}
	require.Equal(t, 404, fetch(t, "GET", srv.URL+"/projects/p/other", &p).StatusCode)
	require.Equal(t, "no such endpoint: GET /projects/p/other", p.Detail)
	require.ElementsMatch(t, []string{"POST /projects/{project}/tools", "GET /projects/{project}/tools", "GET /projects/{project}/tools/{tool}",
		"POST /projects/{project}/tools/{tool}/pause", "POST /projects/{project}/tools/{tool}/resume"}, httpapi.RegistryRoutes())
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
