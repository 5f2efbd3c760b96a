package projector_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// TestApprovalSeamWithTheLedger: the ledger holds calls of a tool whose
// definition requires approval; the views list them with the card's
// arguments and digest; an approver credential approves one over HTTP
// through serve's policy (the POST goes to the ledger API over NATS under
// the credential's approver name) and denies another; an auditor's POST
// is 403; the views then show the approved call dispatched and the denied
// one reported failed, and the decisions in approval.list.
func TestApprovalSeamWithTheLedger(t *testing.T) {
	e := ledgertest.NewAuth(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	_, err = e.L.RegisterToolYAML(ctx, "proj", []byte("tool_name: deploy\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.deploy\nafter_execution: suspend\napproval: {required: true, approvers: [carol]}\n"))
	require.NoError(t, err)
	c1 := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "c1", Epoch: 1, Tool: "deploy"}
	c2 := c1
	c2.ID = "c2"
	for _, c := range []ledgertest.Call{c1, c2} {
		res, err := e.L.Dispatch(ctx, c.Dispatch())
		require.NoError(t, err)
		require.Zero(t, res.CommandSeq, "held: no command")
	}

	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	papi, err := p.ServeAPI(ctx, e.NC, e.L, projector.APIConfig{MaxWait: time.Minute})
	require.NoError(t, err)
	v, err := e.Srv.Keys().Verifier()
	require.NoError(t, err)
	cl := client.New(e.NC)
	hs := httptest.NewServer((&httpapi.Policy{Verifier: v}).Wrap(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{
		Decide: func(ctx context.Context, op, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
			if op == protocol.OpDeny {
				return cl.Deny(ctx, approver, req)
			}
			return cl.Approve(ctx, approver, req)
		},
		Approver: func(r *http.Request) (string, bool) {
			g, ok := auth.GrantFrom(r.Context())
			return g.Approver, ok
		},
	})))
	t.Cleanup(func() {
		hs.Close()
		papi.Stop()
		stop()
		require.NoError(t, <-done)
		require.NoError(t, s.Close())
	})

	carol := e.Srv.Issue(t, auth.Grant{Role: auth.RoleApprover, Project: "proj", Approver: "carol"}, time.Hour)
	auditor := e.Srv.Issue(t, auth.Grant{Role: auth.RoleAuditor, Project: "proj"}, time.Hour).JWT

	// approval.list over NATS with the approver credential itself.
	nc, err := e.Srv.Dial(nats.UserJWTAndSeed(carol.JWT, carol.Seed), nats.CustomInboxPrefix(carol.InboxPrefix))
	require.NoError(t, err)
	defer nc.Close()
	ac := client.New(nc, client.WithActor("carol"))
	page, err := ac.ListApprovals(ctx, "proj", "", "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"c1=pending", "c2=pending"}, states(page.Items))
	item := page.Items[0]
	require.JSONEq(t, `{"q":"c1"}`, string(item.Arguments))
	require.Equal(t, protocol.ArgumentsDigest(item.Arguments), item.ArgumentsDigest, "the views' arguments are the bytes the ledger's digest covers")

	body := func(it protocol.ApprovalItem) string {
		return fmt.Sprintf(`{"tool_call_card_id":%q,"arguments_digest":%q,"reason":"ok"}`, it.ToolCallCardID, it.ArgumentsDigest)
	}
	status, out := send(t, http.MethodPost, hs.URL+"/v1/projects/proj/approvals/t1/c1/approve", auditor, body(item))
	require.Equal(t, http.StatusForbidden, status, "%v", out)
	status, out = send(t, http.MethodPost, hs.URL+"/v1/projects/proj/approvals/t1/c1/approve", carol.JWT, body(item))
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.NotZero(t, out["command_seq"])
	status, out = send(t, http.MethodPost, hs.URL+"/v1/projects/proj/approvals/t1/c1/deny", carol.JWT, body(item))
	require.Equal(t, http.StatusConflict, status, "decided already: %v", out)
	require.Contains(t, strings.ToLower(fmt.Sprint(out["detail"])), "approved")
	status, out = send(t, http.MethodPost, hs.URL+"/v1/projects/proj/approvals/t1/c2/deny", carol.JWT, body(page.Items[1]))
	require.Equal(t, http.StatusOK, status, "%v", out)

	require.Eventually(t, func() bool {
		all, err := ac.ListApprovals(ctx, "proj", protocol.ApprovalListAll, "", 0)
		return err == nil && strings.Join(states(all.Items), " ") == "c1=approved c2=denied"
	}, time.Minute, 10*time.Millisecond)
	got, err := ac.GetApproval(ctx, "proj", "t1", "c1")
	require.NoError(t, err)
	require.Equal(t, "carol", got.Approval.Approver)
	q := projector.NewQueries(s)
	require.Eventually(t, func() bool {
		st1, _, err1 := q.CallState("proj", "t1", "c1", projector.AsOf{})
		st2, _, err2 := q.CallState("proj", "t1", "c2", projector.AsOf{})
		return err1 == nil && err2 == nil && st1.State == projector.StateDispatched && st2.State == projector.StateReported && st2.Status == protocol.StatusFailed
	}, time.Minute, 10*time.Millisecond)
}
