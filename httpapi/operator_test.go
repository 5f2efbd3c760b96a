package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// send makes an HTTP request with a bearer token (none when empty) and
// returns the status and the decoded body.
func send(t *testing.T, method, url, token, body string) (int, map[string]any) {
	t.Helper()
	rq, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		rq.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(rq)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// TestOperatorHTTPWithoutCredentials: a serve without credentials names
// the operator from the body's actor (required, an identifier); the path
// names the call; the op's parser lists every other violation.
func TestOperatorHTTPWithoutCredentials(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "v"))
	defer s.Close()
	var gotActor string
	var gotReq any
	hs := httptest.NewServer(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{
		Operate: func(_ context.Context, op, actor string, req any) (any, error) {
			gotActor, gotReq = actor, req
			return protocol.ResolveResult{Seq: 7, Effect: protocol.EffectApplied}, nil
		},
	}))
	defer hs.Close()
	url := hs.URL + "/v1/projects/proj/turns/t1/calls/c1/resolve"
	status, out := send(t, http.MethodPost, url, "", `{"effect":"applied","reason":"seen upstream","actor":"ops"}`)
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.Equal(t, "ops", gotActor)
	require.Equal(t, protocol.ResolveRequest{ProjectID: "proj", AgentTurnID: "t1", ToolCallID: "c1", Effect: protocol.EffectApplied, Reason: "seen upstream"}, gotReq)

	gotReq = nil
	status, out = send(t, http.MethodPost, hs.URL+"/v1/projects/proj/turns/t1/calls/c1/cancel", "", `{"agent_id":"a"}`)
	require.Equal(t, http.StatusBadRequest, status, "%v", out)
	var fields []string
	for _, v := range out["violations"].([]any) {
		fields = append(fields, v.(map[string]any)["field"].(string))
	}
	require.ElementsMatch(t, []string{"body.actor", "body.reason", "body.agent_id"}, fields)
	require.Nil(t, gotReq, "nothing was sent")
	// The unknown member's violation names what an HTTP body takes: the
	// path's ids are refused in it.
	for _, v := range out["violations"].([]any) {
		if m := v.(map[string]any); m["field"] == "body.agent_id" {
			require.Equal(t, "is not a member of a call.cancel body over HTTP (reason, actor; the path names the call)", m["message"])
		}
	}
	status, out = send(t, http.MethodPost, hs.URL+"/v1/projects/proj/turns/t1/calls/c1/resolve", "", `{"effect":"applied","reason":"r","actor":"ops","why":1}`)
	require.Equal(t, http.StatusBadRequest, status, "%v", out)
	require.Len(t, out["violations"], 1)
	require.Equal(t, "is not a member of a call.resolve body over HTTP (effect, reason, actor; the path names the call)", out["violations"].([]any)[0].(map[string]any)["message"])
}
