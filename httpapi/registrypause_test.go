package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

func postJSON(t *testing.T, u, body string, out any) int {
	t.Helper()
	resp, err := http.Post(u, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	want := "application/json"
	if resp.StatusCode >= 400 {
		want = problem.ContentType
	}
	require.Equal(t, want, resp.Header.Get("Content-Type"), string(b))
	require.NoError(t, json.Unmarshal(b, out), string(b))
	return resp.StatusCode
}

func fieldsOf(p problem.Details) []string {
	var out []string
	for _, v := range p.Violations {
		out = append(out, v.Field)
	}
	return out
}

// TestRegistryPauseResume: POST .../pause and .../resume run tool.pause
// and tool.resume on a real ledger under the request's actor; refusals are
// problems with every violation and the rejection entry's sequence.
func TestRegistryPauseResume(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	_, err := e.L.RegisterToolYAML(ctx, "p", []byte("tool_name: wire\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.wire\nafter_execution: suspend\n"))
	require.NoError(t, err)
	srv := httptest.NewServer(httpapi.NewRegistry(e.L, httpapi.RegistryConfig{Actor: func(*http.Request) string { return "ops" }}))
	t.Cleanup(srv.Close)

	var res protocol.ToolPauseResult
	require.Equal(t, 200, postJSON(t, srv.URL+"/projects/p/tools/wire/pause", `{"reason":"upstream outage"}`, &res))
	require.True(t, res.Paused)
	require.Equal(t, "wire", res.ToolName)
	st, err := e.JS.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(ctx, protocol.PauseSubject("v1", "p", "wire"))
	require.NoError(t, err)
	require.Equal(t, "ops", m.Header.Get(protocol.HeaderActor))

	var p problem.Details
	require.Equal(t, 409, postJSON(t, srv.URL+"/projects/p/tools/wire/pause", `{"reason":"again"}`, &p), "%+v", p)
	require.Equal(t, "conflict", p.Code)
	require.NotZero(t, p.RejectionSeq)
	p = problem.Details{}
	require.Equal(t, 404, postJSON(t, srv.URL+"/projects/p/tools/nosuch/resume", `{"reason":"x"}`, &p))
	require.Equal(t, "not_found", p.Code)
	require.Equal(t, []string{"body.tool_name", "body.tool_name"}, fieldsOf(p), "unknown, and not paused")
	p = problem.Details{}
	require.Equal(t, 400, postJSON(t, srv.URL+"/projects/p/tools/wire/resume", `{"reason":"`+strings.Repeat("x", 1025)+`","extra":true}`, &p))
	require.ElementsMatch(t, []string{"body.reason", "body.extra"}, fieldsOf(p))
	require.NotZero(t, p.RejectionSeq, "recorded")
	p = problem.Details{}
	require.Equal(t, 400, postJSON(t, srv.URL+"/projects/p/tools/wire/resume", `{"reason":"x","tool_name":"other","project_id":"q"}`, &p))
	require.ElementsMatch(t, []string{"body.tool_name", "body.project_id"}, fieldsOf(p))
	// Refused before the ledger, yet every violation is listed: the path's
	// and the request's own (an empty reason, a member it does not take).
	require.Equal(t, 400, postJSON(t, srv.URL+"/projects/p/tools/wire/pause", `{"reason":"","zzz":1,"project_id":"other"}`, &p))
	require.ElementsMatch(t, []string{"body.project_id", "body.reason", "body.zzz"}, fieldsOf(p))
	p = problem.Details{}
	require.Equal(t, 400, postJSON(t, srv.URL+"/projects/p/tools/wire/resume", `[1]`, &p))
	require.Equal(t, []string{"body"}, fieldsOf(p))

	res = protocol.ToolPauseResult{}
	require.Equal(t, 200, postJSON(t, srv.URL+"/projects/p/tools/wire/resume", `{"reason":"fixed"}`, &res))
	require.False(t, res.Paused)
}
