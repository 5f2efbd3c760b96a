package projector_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// TestApprovalReadsOverNATS: approval.list and approval.get answered by
// the views over NATS (an admin credential of the project), after waiting
// for the views to reach the ledger's last entry; bad bodies refused with
// every violation, a project other than the subject's forbidden.
func TestApprovalReadsOverNATS(t *testing.T) {
	r := newInboxRig(t)
	ctx := ledgertest.Ctx(t)
	writeApprovalScenario(t, r.Env)
	w := r.worker(t, auth.Grant{Role: auth.RoleAdmin, Project: "proj"})
	w.c = client.New(w.nc, client.WithActor("ops"))

	page, err := w.c.ListApprovals(ctx, "proj", "", "", 1)
	require.NoError(t, err)
	require.GreaterOrEqual(t, page.AsOfSeq, page.LedgerSeq, "the page accounts for every entry stored before the request")
	require.Equal(t, []string{"c3=pending"}, states(page.Items))
	require.NotEmpty(t, page.NextCursor)
	next, err := w.c.ListApprovals(ctx, "proj", protocol.ApprovalPending, page.NextCursor, 1)
	require.NoError(t, err)
	require.Equal(t, []string{"s1=pending"}, states(next.Items))
	require.Empty(t, next.NextCursor)
	decided, err := w.c.ListApprovals(ctx, "proj", protocol.ApprovalListDecided, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"c1=approved", "c2=denied"}, states(decided.Items))

	got, err := w.c.GetApproval(ctx, "proj", "t1", "c2")
	require.NoError(t, err)
	require.Equal(t, protocol.ApprovalDenied, got.Approval.State)
	require.JSONEq(t, `{"q":"c2"}`, string(got.Approval.Arguments))
	_, err = w.c.GetApproval(ctx, "proj", "t1", "none")
	require.ErrorIs(t, err, protocol.ErrNotFound)

	_, err = w.c.ListApprovals(ctx, "proj", "soon", page.NextCursor, -1)
	var pe *protocol.Error
	require.ErrorAs(t, err, &pe)
	require.ElementsMatch(t, []string{"body.state", "body.limit"}, fields(pe.Violations), "every violation at once")
	_, err = w.c.ListApprovals(ctx, "proj", protocol.ApprovalListAll, page.NextCursor, 0)
	require.ErrorAs(t, err, &pe)
	require.Equal(t, []string{"body.cursor"}, fields(pe.Violations), "a cursor of the pending listing")
	rep := w.reply(t, protocol.APISubject("proj", "x", protocol.OpApprovalGet), `{"project_id":"other","agent_turn_id":"t1","tool_call_id":"c1"}`)
	require.False(t, rep.OK)
	require.Equal(t, protocol.CodeForbidden, rep.Error.Code)
	rep = w.reply(t, protocol.APISubject("proj", "x", protocol.OpApprovalGet), `{"project_id":"proj"}`)
	require.False(t, rep.OK)
	require.ElementsMatch(t, []string{"body.agent_turn_id", "body.tool_call_id"}, fields(rep.Error.Violations))
	requireMetric(t, r.reg, 3, "cgledger_projector_api_requests_total", "op", "approval.list", "code", "ok")
}

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

// TestApprovalsHTTPAuth: the approvals endpoints behind serve's bearer
// policy: no bearer 401; another project's credential 403; an auditor
// reads but may not decide (403 before anything reaches the ledger); a
// worker reads nothing.
func TestApprovalsHTTPAuth(t *testing.T) {
	r := newInboxRig(t)
	sc := writeApprovalScenario(t, r.Env)
	auditor := r.Srv.Issue(t, auth.Grant{Role: auth.RoleAuditor, Project: "proj"}, time.Hour).JWT
	other := r.Srv.Issue(t, auth.Grant{Role: auth.RoleAuditor, Project: "other"}, time.Hour).JWT
	worker := r.Srv.Issue(t, auth.Grant{Role: auth.RoleWorker, Project: "proj"}, time.Hour).JWT
	list := r.http + "/v1/projects/proj/approvals?state=all"
	one := r.http + "/v1/projects/proj/approvals/t1/c3"

	status, _ := send(t, http.MethodGet, list, "", "")
	require.Equal(t, http.StatusUnauthorized, status)
	status, _ = send(t, http.MethodGet, list, other, "")
	require.Equal(t, http.StatusForbidden, status)
	status, _ = send(t, http.MethodGet, list, worker, "")
	require.Equal(t, http.StatusForbidden, status)
	require.Eventually(t, func() bool {
		var page projector.Page[projector.ApprovalItem]
		return r.get(t, auditor, "/v1/projects/proj/approvals?state=all", &page) == http.StatusOK && len(page.Items) == 4
	}, time.Minute, 10*time.Millisecond)
	var got projector.ApprovalAnswer
	require.Equal(t, http.StatusOK, r.get(t, auditor, "/v1/projects/proj/approvals/t1/c3", &got))
	require.Equal(t, sc.held3, got.Approval.HeldSeq)
	require.Equal(t, protocol.ApprovalPending, got.Approval.State)

	body := `{"tool_call_card_id":"cc-t1-c3","arguments_digest":"` + got.Approval.ArgumentsDigest + `"}`
	for _, tok := range []string{auditor, r.adminToken(t), worker, other} {
		status, p := send(t, http.MethodPost, one+"/approve", tok, body)
		require.Equal(t, http.StatusForbidden, status, "%v", p)
	}
	status, _ = send(t, http.MethodPost, one+"/deny", "", body)
	require.Equal(t, http.StatusUnauthorized, status)
}

// TestApprovalsHTTPDecide: POST approve and deny send the request the
// ledger takes (the call from the path, card, digest and reason from the
// body) as the approver, answer its result, map its refusals to problem
// details with their status, and refuse a bad body listing every
// violation before sending anything. The ledger side is a DecideFunc
// here: the ledger's approve and deny have their own tests.
func TestApprovalsHTTPDecide(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	writeApprovalScenario(t, e)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	require.NoError(t, newProjector(t, e, s, 8).CatchUp(ctx))
	type sent struct {
		op, approver string
		req          protocol.ApprovalRequest
	}
	var calls []sent
	decide := func(_ context.Context, op, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
		calls = append(calls, sent{op, approver, req})
		if req.ToolCallID == "c1" {
			return protocol.ApprovalResult{}, &protocol.Error{Code: protocol.CodeConflict, Message: "already approved", Seq: 99}
		}
		return protocol.ApprovalResult{Seq: 42, Decision: protocol.ApprovalApproved, CommandSeq: 43}, nil
	}
	approver := "carol"
	hs := httptest.NewServer(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{
		Decide:   decide,
		Approver: func(*http.Request) (string, bool) { return approver, true },
	}))
	defer hs.Close()
	digest := protocol.ArgumentsDigest(json.RawMessage(`{"q":"c3"}`))
	base := hs.URL + "/v1/projects/proj/approvals/t1/"

	status, out := send(t, http.MethodPost, base+"c3/approve", "", `{"tool_call_card_id":"cc-t1-c3","arguments_digest":"`+digest+`","reason":"ok"}`)
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.EqualValues(t, 43, out["command_seq"])
	require.Equal(t, []sent{{protocol.OpApprove, "carol", protocol.ApprovalRequest{ProjectID: "proj", AgentTurnID: "t1", ToolCallID: "c3",
		ToolCallCardID: "cc-t1-c3", ArgumentsDigest: digest, Reason: "ok"}}}, calls)

	status, out = send(t, http.MethodPost, base+"c1/deny", "", `{"tool_call_card_id":"cc-t1-c1","arguments_digest":"`+digest+`"}`)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "conflict", out["code"])
	require.EqualValues(t, 99, out["rejection_seq"])
	require.Equal(t, protocol.OpDeny, calls[1].op)

	status, out = send(t, http.MethodPost, base+"c3/approve", "", `{"tool_call_id":"x","arguments_digest":"md5:1","approver":"mallory","reason":"`+strings.Repeat("r", 2000)+`"}`)
	require.Equal(t, http.StatusBadRequest, status)
	var vs []string
	for _, v := range out["violations"].([]any) {
		vs = append(vs, v.(map[string]any)["field"].(string))
	}
	require.ElementsMatch(t, []string{"body.tool_call_id", "body.approver", "body.tool_call_card_id", "body.arguments_digest", "body.reason"}, vs)
	require.Len(t, calls, 2, "nothing sent for a bad body")

	approver = ""
	status, out = send(t, http.MethodPost, base+"c3/approve", "", `{"tool_call_card_id":"cc-t1-c3","arguments_digest":"`+digest+`"}`)
	require.Equal(t, http.StatusForbidden, status, "a credential without an approver name: %v", out)
	require.Len(t, calls, 2)

	open := httptest.NewServer(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{Decide: decide}))
	defer open.Close()
	status, _ = send(t, http.MethodPost, open.URL+"/v1/projects/proj/approvals/t1/c3/approve", "", `{"tool_call_card_id":"cc-t1-c3","arguments_digest":"`+digest+`","approver":"dave"}`)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "dave", calls[2].approver, "without credentials the body names the approver")

	// The reads list every parameter problem at once.
	status, out = send(t, http.MethodGet, hs.URL+"/v1/projects/proj/approvals?state=soon&limit=-1&as_of_seq=x", "", "")
	require.Equal(t, http.StatusBadRequest, status)
	vs = nil
	for _, v := range out["violations"].([]any) {
		vs = append(vs, v.(map[string]any)["field"].(string))
	}
	require.ElementsMatch(t, []string{"state", "limit", "as_of_seq"}, vs)
	var page projector.Page[projector.ApprovalItem]
	require.Equal(t, http.StatusOK, getJSON(t, hs.URL+"/v1/projects/proj/approvals?state=all&limit=1", &page))
	require.Equal(t, []string{"c1=approved"}, states(page.Items))
	status, out = send(t, http.MethodGet, hs.URL+"/v1/projects/proj/approvals?state=decided&cursor="+page.NextCursor, "", "")
	require.Equal(t, http.StatusBadRequest, status, "a cursor of state=all: %v", out)
	status, _ = send(t, http.MethodGet, hs.URL+"/v1/projects/proj/approvals/t1/nope", "", "")
	require.Equal(t, http.StatusNotFound, status)

	none := httptest.NewServer(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{}))
	defer none.Close()
	status, _ = send(t, http.MethodPost, none.URL+"/v1/projects/proj/approvals/t1/c3/approve", "", `{"tool_call_card_id":"cc-t1-c3","arguments_digest":"`+digest+`","approver":"dave"}`)
	require.Equal(t, http.StatusNotFound, status, "a server that reaches no ledger API decides nothing")
}
