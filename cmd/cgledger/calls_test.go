package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// postAs sends a POST with bearer token tok (none when empty) and returns
// the status and the decoded body.
func postAs(t *testing.T, url, tok, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return resp.StatusCode, out
}

// TestCallsOperatorActionsOverHTTP: serve's HTTP operator actions, behind
// its credential policy, with a real ledger behind them: no bearer is 401;
// an auditor, worker, approver or another project's admin is 403; a bad
// body is 400 with every violation; the CLI with an admin credential
// cancels another agent's call (recorded under the credential's label)
// and resolves an outcome_unknown call, whose second, different resolution
// is refused (409, exit 1).
func TestCallsOperatorActionsOverHTTP(t *testing.T) {
	e := ledgertest.NewAuth(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	running := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "c1", Epoch: 1, Tool: "deploy"}
	_, err = e.L.Dispatch(ctx, running.Dispatch())
	require.NoError(t, err)
	lost := running
	lost.ID, lost.Tool = "c2", "pay"
	_, err = e.L.Dispatch(ctx, lost.Dispatch())
	require.NoError(t, err)
	_, err = e.L.StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: lost.Project, AgentTurnID: lost.Turn, ToolCallID: lost.ID, ExecutorID: "svc"})
	require.NoError(t, err)
	card := lost.ResultCard(protocol.StatusFailed, `null`)
	card.Content = json.RawMessage(`{"status":"failed","result":null,"error":{"code":"internal_error","message":"lost","detail":{"taxonomy_code":"S-TOOL-OUTCOME-UNKNOWN"}}}`)
	_, err = e.L.PutCard(ctx, card)
	require.NoError(t, err)
	rep := lost.Report(protocol.StatusFailed)
	rep.Payload.AttemptOutcome = protocol.AttemptOutcomeUnknown
	_, err = e.L.Report(ctx, rep)
	require.NoError(t, err)

	s, err := projector.OpenStore(filepath.Join(t.TempDir(), "views"), projector.StoreOptions{})
	require.NoError(t, err)
	defer s.Close()
	v, err := e.Srv.Keys().Verifier()
	require.NoError(t, err)
	hs := httptest.NewServer((&httpapi.Policy{Verifier: v}).Wrap(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{
		Operate: operatorActions(e.NC), Operator: httpOperator(true),
	})))
	defer hs.Close()
	cancelURL := hs.URL + "/v1/projects/proj/turns/t1/calls/c1/cancel"
	resolveURL := hs.URL + "/v1/projects/proj/turns/t1/calls/c2/resolve"

	status, _ := postAs(t, cancelURL, "", `{"reason":"stop"}`)
	require.Equal(t, http.StatusUnauthorized, status)
	for _, g := range []auth.Grant{
		{Role: auth.RoleAuditor, Project: "proj"},
		{Role: auth.RoleWorker, Project: "proj", Agent: "alice"},
		{Role: auth.RoleApprover, Project: "proj", Approver: "carol"},
		{Role: auth.RoleAdmin, Project: "other"},
	} {
		tok := e.Srv.Issue(t, g, time.Hour).JWT
		status, out := postAs(t, cancelURL, tok, `{"reason":"stop"}`)
		require.Equal(t, http.StatusForbidden, status, "%s: %v", g.Role, out)
		status, _ = postAs(t, resolveURL, tok, `{"effect":"applied","reason":"r"}`)
		require.Equal(t, http.StatusForbidden, status, g.Role)
	}
	admin := e.Srv.Issue(t, auth.Grant{Role: auth.RoleAdmin, Project: "proj", Label: "ops-anna"}, time.Hour)
	status, out := postAs(t, resolveURL, admin.JWT, `{"effect":"maybe","tool_call_id":"x","actor":"me"}`)
	require.Equal(t, http.StatusBadRequest, status, "%v", out)
	var fields []string
	for _, v := range out["violations"].([]any) {
		fields = append(fields, v.(map[string]any)["field"].(string))
	}
	require.ElementsMatch(t, []string{"body.tool_call_id", "body.actor", "body.effect", "body.reason"}, fields)
	canceled, err := e.L.Canceled(ctx, "proj", "main", "t1", "c1")
	require.NoError(t, err)
	require.False(t, canceled, "nothing was canceled by a refused request")

	creds := filepath.Join(t.TempDir(), "admin.creds")
	require.NoError(t, os.WriteFile(creds, admin.Creds, 0o600))
	t.Setenv("CGLEDGER_NATS_CREDS", "")
	t.Setenv("CGLEDGER_DATA", t.TempDir())
	conn := []string{"--server", hs.URL, "--creds", creds, "--project", "proj", "--turn", "t1"}

	code, _ := runCLI(t, append([]string{"calls", "cancel", "--call", "c1"}, conn...)...)
	require.Equal(t, exitUsage, code, "--reason is required")
	code, out2 := runCLI(t, append([]string{"calls", "cancel", "--call", "c1", "--reason", "runaway"}, conn...)...)
	require.Equal(t, exitOK, code, out2)
	require.Contains(t, out2, "canceled (cancel entry, ledger seq")
	stream, err := e.JS.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	m, err := stream.GetLastMsgForSubject(ctx, protocol.CancelSubject("v1", "proj", "main", "t1", "c1"))
	require.NoError(t, err)
	require.Equal(t, "ops-anna", m.Header.Get(protocol.HeaderActor), "recorded under the admin credential's label")

	code, _ = runCLI(t, append([]string{"calls", "resolve", "--call", "c2", "--reason", "bank says no"}, conn...)...)
	require.Equal(t, exitUsage, code, "--effect is required")
	code, out2 = runCLI(t, append([]string{"calls", "resolve", "--call", "c2", "--effect", "not_applied", "--reason", "bank says no"}, conn...)...)
	require.Equal(t, exitOK, code, out2)
	require.Contains(t, out2, "resolved not_applied (ledger seq")
	res, err := e.L.Resolution(ctx, "proj", "t1", "c2")
	require.NoError(t, err)
	require.Equal(t, "ops-anna", res.Actor)
	code, _ = runCLI(t, append([]string{"calls", "resolve", "--call", "c2", "--effect", "applied", "--reason", "changed"}, conn...)...)
	require.Equal(t, exitFailed, code, "resolved already: refused")
	status, out = postAs(t, resolveURL, admin.JWT, `{"effect":"applied","reason":"changed"}`)
	require.Equal(t, http.StatusConflict, status, "%v", out)
	require.NotZero(t, out["rejection_seq"], "the refusal is recorded")
}

// TestCallsRedriveOverHTTP: POST .../calls/{call}/redrive behind serve's
// credential policy, with a real ledger behind it: a non-admin is 403; a
// bad body is 400 listing every violation; the CLI with an admin
// credential redrives a failed call (the derived call <call>~r1 is
// dispatched, the redrive recorded under the credential's label); a second,
// different redrive is refused (409, exit 1, recorded).
func TestCallsRedriveOverHTTP(t *testing.T) {
	e := ledgertest.NewAuth(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	failed := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "c1", Epoch: 1, Tool: "deploy"}
	e.Complete(t, failed, protocol.StatusFailed, `null`)

	s, err := projector.OpenStore(filepath.Join(t.TempDir(), "views"), projector.StoreOptions{})
	require.NoError(t, err)
	defer s.Close()
	v, err := e.Srv.Keys().Verifier()
	require.NoError(t, err)
	hs := httptest.NewServer((&httpapi.Policy{Verifier: v}).Wrap(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{
		Operate: operatorActions(e.NC), Operator: httpOperator(true),
	})))
	defer hs.Close()
	redriveURL := hs.URL + "/v1/projects/proj/turns/t1/calls/c1/redrive"
	for _, g := range []auth.Grant{
		{Role: auth.RoleAuditor, Project: "proj"},
		{Role: auth.RoleWorker, Project: "proj", Agent: "alice"},
		{Role: auth.RoleAdmin, Project: "other"},
	} {
		status, out := postAs(t, redriveURL, e.Srv.Issue(t, g, time.Hour).JWT, `{"reason":"again"}`)
		require.Equal(t, http.StatusForbidden, status, "%s: %v", g.Role, out)
	}
	admin := e.Srv.Issue(t, auth.Grant{Role: auth.RoleAdmin, Project: "proj", Label: "ops-anna"}, time.Hour)
	status, out := postAs(t, redriveURL, admin.JWT, `{"tool_call_id":"x","actor":"me","effect":"applied"}`)
	require.Equal(t, http.StatusBadRequest, status, "%v", out)
	var fields []string
	for _, v := range out["violations"].([]any) {
		fields = append(fields, v.(map[string]any)["field"].(string))
	}
	require.ElementsMatch(t, []string{"body.tool_call_id", "body.actor", "body.effect", "body.reason"}, fields)

	creds := filepath.Join(t.TempDir(), "admin.creds")
	require.NoError(t, os.WriteFile(creds, admin.Creds, 0o600))
	t.Setenv("CGLEDGER_NATS_CREDS", "")
	t.Setenv("CGLEDGER_DATA", t.TempDir())
	conn := []string{"--server", hs.URL, "--creds", creds, "--project", "proj", "--turn", "t1"}
	code, _ := runCLI(t, append([]string{"calls", "redrive", "--call", "c1"}, conn...)...)
	require.Equal(t, exitUsage, code, "--reason is required")
	code, out2 := runCLI(t, append([]string{"calls", "redrive", "--call", "c1", "--reason", "the deploy host is back"}, conn...)...)
	require.Equal(t, exitOK, code, out2)
	require.Contains(t, out2, "redriven as c1~r1 (dispatched; ledger seq")
	rd, err := e.L.RedriveOf(ctx, "proj", "t1", "c1")
	require.NoError(t, err)
	require.Equal(t, "ops-anna", rd.Actor, "recorded under the admin credential's label")
	rec, err := e.L.GetCall(ctx, "proj", "t1", "c1~r1")
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State)
	code, out2 = runCLI(t, append([]string{"calls", "redrive", "--call", "c1", "--reason", "the deploy host is back", "--json"}, conn...)...)
	require.Equal(t, exitOK, code, out2)
	require.Contains(t, out2, `"duplicate":true`)
	code, _ = runCLI(t, append([]string{"calls", "redrive", "--call", "c1", "--reason", "the deploy host is back", "--actor", "ops-bob"}, conn...)...)
	require.Equal(t, exitFailed, code, "with credentials the actor is the credential's: --actor is refused")
	code, _ = runCLI(t, append([]string{"calls", "redrive", "--call", "c1", "--reason", "changed"}, conn...)...)
	require.Equal(t, exitFailed, code, "redriven already: refused")
	status, out = postAs(t, redriveURL, admin.JWT, `{"reason":"changed"}`)
	require.Equal(t, http.StatusConflict, status, "%v", out)
	require.NotZero(t, out["rejection_seq"], "the refusal is recorded")
	require.Contains(t, out["violations"].([]any)[0].(map[string]any)["message"], "already redriven as c1~r1")
}

// TestCallsActorWithoutCredentials: against a serve without credentials
// the operator verbs need --actor (the body's actor), which the entries
// record: without it the server refuses body.actor.
func TestCallsActorWithoutCredentials(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	failed := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "c1", Epoch: 1, Tool: "deploy"}
	e.Complete(t, failed, protocol.StatusFailed, `null`)
	s, err := projector.OpenStore(filepath.Join(t.TempDir(), "views"), projector.StoreOptions{})
	require.NoError(t, err)
	defer s.Close()
	hs := httptest.NewServer(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{
		Operate: operatorActions(e.NC), Operator: httpOperator(false),
	}))
	defer hs.Close()
	t.Setenv("CGLEDGER_NATS_CREDS", "")
	t.Setenv("CGLEDGER_DATA", t.TempDir())
	conn := []string{"--server", hs.URL, "--project", "proj", "--turn", "t1", "--call", "c1", "--reason", "host is back"}

	code, _ := runCLI(t, append([]string{"calls", "redrive"}, conn...)...)
	require.Equal(t, exitFailed, code, "no actor: the server refuses body.actor")
	_, err = e.L.GetCall(ctx, "proj", "t1", "c1~r1")
	require.Error(t, err, "nothing was redriven")
	code, out := runCLI(t, append([]string{"calls", "redrive", "--actor", "ops-bob"}, conn...)...)
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "redriven as c1~r1")
	rd, err := e.L.RedriveOf(ctx, "proj", "t1", "c1")
	require.NoError(t, err)
	require.Equal(t, "ops-bob", rd.Actor)
}
