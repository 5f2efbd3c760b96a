package auth_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/internal/auth"
)

func keys(t *testing.T) (*auth.Keys, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "auth")
	k, err := auth.LoadOrCreateKeys(dir)
	require.NoError(t, err)
	return k, dir
}

func TestKeysPersistAndAreSecret(t *testing.T) {
	k, dir := keys(t)
	again, err := auth.LoadOrCreateKeys(dir)
	require.NoError(t, err)
	a1, _ := k.Account.PublicKey()
	a2, _ := again.Account.PublicKey()
	require.Equal(t, a1, a2, "the account key survives restarts")
	info, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm())
	files, _ := filepath.Glob(filepath.Join(dir, "*.nk"))
	require.Len(t, files, 6)
	for _, f := range files {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), f)
	}

	// Deleting the signing key rotates it: old credentials stop verifying,
	// the account stays.
	is, err := k.Issuer()
	require.NoError(t, err)
	old, err := is.Issue(auth.Grant{Role: auth.RoleAuditor, Project: "p"}, time.Hour, time.Now())
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(dir, "clients-signing.nk")))
	rotated, err := auth.LoadOrCreateKeys(dir)
	require.NoError(t, err)
	a3, _ := rotated.Account.PublicKey()
	require.Equal(t, a1, a3)
	v, err := rotated.Verifier()
	require.NoError(t, err)
	_, err = v.Verify(old.JWT, time.Now())
	require.ErrorIs(t, err, auth.ErrBadCredential)

	// A half-deleted key set is not silently replaced.
	require.NoError(t, os.Remove(filepath.Join(dir, "operator.nk")))
	_, err = auth.LoadOrCreateKeys(dir)
	require.Error(t, err)
}

func TestGrantValidationListsEveryProblem(t *testing.T) {
	errs := auth.Grant{Role: "boss", Project: "a.b", Agent: "x>y", Tool: "t"}.Validate()
	require.Len(t, errs, 5, "%v", errs) // role, project, agent invalid, agent and tool on a role that takes neither
	require.NotEmpty(t, auth.Grant{Role: auth.RoleWorker, Project: "*"}.Validate(), "only admin and auditor span projects")
	require.NotEmpty(t, auth.Grant{Role: auth.RoleWorker, Project: "_"}.Validate())
	require.Empty(t, auth.Grant{Role: auth.RoleAdmin, Project: "*"}.Validate())
	require.Empty(t, auth.Grant{Role: auth.RoleWorker, Project: "p", Agent: "a", Target: "w"}.Validate())
}

func TestIssuedCredentialCarriesPermissionsAndExpiry(t *testing.T) {
	k, _ := keys(t)
	is, err := k.Issuer()
	require.NoError(t, err)
	now := time.Now()
	c, err := is.Issue(auth.Grant{Role: auth.RoleTool, Project: "p", Tool: "echo"}, 10*time.Minute, now)
	require.NoError(t, err)
	require.True(t, strings.Contains(string(c.Creds), "BEGIN NATS USER JWT"))
	uc, err := jwt.DecodeUserClaims(c.JWT)
	require.NoError(t, err)
	require.Equal(t, now.Add(10*time.Minute).Truncate(time.Second).Unix(), uc.Expires)
	require.Contains(t, uc.Pub.Allow, "cgledger.v1.p.echo.report")
	require.Contains(t, uc.Pub.Allow, auth.ToolJSAPIPrefix+".CONSUMER.MSG.NEXT.CG_LEDGER."+auth.ToolConsumerName("p", "echo"))
	require.Contains(t, uc.Sub.Allow, c.InboxPrefix+".>")
	for _, s := range append(uc.Pub.Allow, uc.Sub.Allow...) {
		require.False(t, strings.HasPrefix(s, "cg.>") || s == ">" || strings.HasPrefix(s, "$KV") || s == "_INBOX.>", s)
	}
	for _, s := range uc.Pub.Allow {
		require.False(t, strings.HasPrefix(s, "cg."), "a client never publishes on the ledger stream: %s", s)
	}
	require.NotEqual(t, auth.ToolConsumerName("p", "echo"), auth.ToolConsumerName("p2", "echo"))

	// A tool credential for a PMO built-in receives that built-in's
	// commands (cmd.sys.pmo.internal) and pulls its consumer; no cmd.tool.
	pmo, err := is.Issue(auth.Grant{Role: auth.RoleTool, Project: "p", Tool: "delegate_async"}, 10*time.Minute, now)
	require.NoError(t, err)
	uc, err = jwt.DecodeUserClaims(pmo.JWT)
	require.NoError(t, err)
	require.Contains(t, uc.Sub.Allow, "cg.v1.p.*.cmd.sys.pmo.internal.delegate_async")
	require.Contains(t, uc.Pub.Allow, "cgledger.v1.p.delegate_async.tool.consumer")
	require.Contains(t, uc.Pub.Allow, auth.ToolJSAPIPrefix+".CONSUMER.MSG.NEXT.CG_LEDGER."+auth.ToolConsumerName("p", "delegate_async"))
	for _, s := range uc.Sub.Allow {
		require.NotContains(t, s, "cmd.tool", "a PMO tool's credential receives no tool commands")
	}
}

// TestWorkerPermissionsAreExact pins what a worker credential may publish
// and subscribe to, bound to an agent, to a worker target, to both or to
// neither (docs/security.md, "Permission matrix").
func TestWorkerPermissionsAreExact(t *testing.T) {
	const u = "UKEY"
	ops := func(actor string) []string {
		var out []string
		for _, op := range auth.WorkerOps {
			out = append(out, "cgledger.v1.p."+actor+"."+op)
		}
		return out
	}
	require.Contains(t, auth.WorkerOps, "inbox.list")
	for _, tc := range []struct {
		agent, target string
		pubActor      string
		wakeups       string
	}{
		{"", "", "*", "cg.v1.p.*.cmd.agent.*.wakeup"},
		{"a1", "", "a1", "cg.v1.p.*.cmd.agent.a1.wakeup"},
		{"", "w1", "*", "cg.v1.p.*.cmd.agent.w1.wakeup"},
		{"a1", "w1", "a1", "cg.v1.p.*.cmd.agent.w1.wakeup"},
	} {
		pub, sub := auth.Grant{Role: auth.RoleWorker, Project: "p", Agent: tc.agent, Target: tc.target}.Permissions(u)
		require.Equal(t, ops(tc.pubActor), pub, "agent %q target %q", tc.agent, tc.target)
		require.Equal(t, []string{auth.InboxPrefix(u) + ".>", tc.wakeups}, sub, "agent %q target %q", tc.agent, tc.target)
	}
}

// TestProjectAccountsFollowTheKeys: a project credential's account JWT is
// written where the server's resolver finds it; after the clients' signing
// key is rotated, the resolver ignores the old JWT left on disk, so every
// old project credential is revoked on NATS too.
func TestProjectAccountsFollowTheKeys(t *testing.T) {
	k, dir := keys(t)
	is, err := k.Issuer()
	require.NoError(t, err)
	c, err := is.Issue(auth.Grant{Role: auth.RoleWorker, Project: "p/1"}, time.Hour, time.Now())
	require.NoError(t, err)
	uc, err := jwt.DecodeUserClaims(c.JWT)
	require.NoError(t, err)
	acc := uc.Issuer
	trust, err := k.Trust()
	require.NoError(t, err)
	res, err := auth.NewAccountResolver(trust.AccountJWTs, k)
	require.NoError(t, err)
	tok, err := res.Fetch(acc)
	require.NoError(t, err)
	ac, err := jwt.DecodeAccountClaims(tok)
	require.NoError(t, err)
	require.Equal(t, "project:p/1", ac.Name)
	for _, im := range ac.Imports {
		if im.Name == "ledger api" {
			require.Equal(t, "cgledger.v1.p/1.>", string(im.Subject), "only its own project's API")
		}
	}

	require.NoError(t, os.Remove(filepath.Join(dir, "clients-signing.nk")))
	rotated, err := auth.LoadOrCreateKeys(dir)
	require.NoError(t, err)
	trust, err = rotated.Trust()
	require.NoError(t, err)
	res, err = auth.NewAccountResolver(trust.AccountJWTs, rotated)
	require.NoError(t, err)
	_, err = res.Fetch(acc)
	require.Error(t, err, "a stale project account is not served")
	v, err := rotated.Verifier()
	require.NoError(t, err)
	_, err = v.Verify(c.JWT, time.Now())
	require.ErrorIs(t, err, auth.ErrBadCredential)
}

// TestConcurrentIssuesForOneProject: issuing many credentials for one
// project at once (each writes the project's account JWT) all succeed and
// leave a whole file.
func TestConcurrentIssuesForOneProject(t *testing.T) {
	k, _ := keys(t)
	is, err := k.Issuer()
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := is.Issue(auth.Grant{Role: auth.RoleAdmin, Project: "race"}, time.Hour, time.Now())
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	files, err := filepath.Glob(filepath.Join(k.Dir, "accounts", "*"))
	require.NoError(t, err)
	require.Len(t, files, 1, "one account file, no temporary files left: %v", files)
	b, err := os.ReadFile(files[0])
	require.NoError(t, err)
	_, err = jwt.DecodeAccountClaims(strings.TrimSpace(string(b)))
	require.NoError(t, err)
}

// TestApproverGrant: an approver credential is bound to one name in one
// project (every problem listed), publishes only its four operations
// under that name, reads nothing but its replies, and on HTTP reaches only
// its project's approvals; only an approver decides over HTTP.
func TestApproverGrant(t *testing.T) {
	errs := auth.Grant{Role: auth.RoleApprover, Project: "*"}.Validate()
	require.Len(t, errs, 2, "%v", errs)
	require.Contains(t, errs[0], "project \"*\"")
	require.Contains(t, errs[1], "approver (the approver's name) is required")
	errs = auth.Grant{Role: auth.RoleApprover, Project: "p", Approver: "a.b", Agent: "x"}.Validate()
	require.Len(t, errs, 2, "%v", errs)
	require.Contains(t, errs[0], "approver \"a.b\" is not an identifier")
	require.Contains(t, errs[1], "agent and target are for worker credentials only")
	require.Equal(t, []string{"approver is for approver credentials only"}, auth.Grant{Role: auth.RoleAuditor, Project: "p", Approver: "alice"}.Validate())
	require.Empty(t, auth.Grant{Role: auth.RoleApprover, Project: "p", Approver: "alice"}.Validate())

	const u = "UKEY"
	pub, sub := auth.Grant{Role: auth.RoleApprover, Project: "p", Approver: "alice"}.Permissions(u)
	require.Equal(t, []string{"cgledger.v1.p.alice.approve", "cgledger.v1.p.alice.deny", "cgledger.v1.p.alice.approval.list", "cgledger.v1.p.alice.approval.get"}, pub)
	require.Equal(t, []string{auth.InboxPrefix(u) + ".>"}, sub)

	k, _ := keys(t)
	is, err := k.Issuer()
	require.NoError(t, err)
	v, err := k.Verifier()
	require.NoError(t, err)
	now := time.Now()
	pol := &httpapi.Policy{Verifier: v, Now: func() time.Time { return now }}
	srv := httptest.NewServer(pol.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })))
	defer srv.Close()
	tok := func(g auth.Grant) string {
		c, err := is.Issue(g, time.Hour, now)
		require.NoError(t, err)
		return c.JWT
	}
	approverA := tok(auth.Grant{Role: auth.RoleApprover, Project: "A", Approver: "alice"})
	adminA := tok(auth.Grant{Role: auth.RoleAdmin, Project: "A"})
	auditorA := tok(auth.Grant{Role: auth.RoleAuditor, Project: "A"})
	adminAll := tok(auth.Grant{Role: auth.RoleAdmin, Project: auth.AllProjects})
	workerA := tok(auth.Grant{Role: auth.RoleWorker, Project: "A"})
	for _, tc := range []struct {
		method, path, token string
		want                int
	}{
		{"GET", "/v1/projects/A/approvals?state=pending", approverA, http.StatusTeapot},
		{"GET", "/v1/projects/A/approvals/t1/c1", approverA, http.StatusTeapot},
		{"POST", "/v1/projects/A/approvals/t1/c1/approve", approverA, http.StatusTeapot},
		{"POST", "/v1/projects/A/approvals/t1/c1/deny", approverA, http.StatusTeapot},
		{"POST", "/v1/projects/A/approvals/t1/c1/other", approverA, http.StatusForbidden},
		{"POST", "/v1/projects/B/approvals/t1/c1/approve", approverA, http.StatusForbidden},
		{"GET", "/v1/projects/B/approvals", approverA, http.StatusForbidden},
		{"GET", "/v1/projects/A/calls", approverA, http.StatusForbidden},
		{"GET", "/v1/digest", approverA, http.StatusForbidden},
		{"GET", "/projects/A/tools", approverA, http.StatusForbidden},
		{"GET", "/v1/projects/A/approvals", auditorA, http.StatusTeapot},
		{"GET", "/v1/projects/A/approvals/t1/c1", adminA, http.StatusTeapot},
		{"POST", "/v1/projects/A/approvals/t1/c1/approve", adminA, http.StatusForbidden},
		{"POST", "/v1/projects/A/approvals/t1/c1/deny", auditorA, http.StatusForbidden},
		// Operator actions: an admin of the project (or of every project) only.
		{"POST", "/v1/projects/A/turns/t1/calls/c1/cancel", adminA, http.StatusTeapot},
		{"POST", "/v1/projects/A/turns/t1/calls/c1/resolve", adminAll, http.StatusTeapot},
		{"POST", "/v1/projects/A/turns/t1/calls/c1/cancel", auditorA, http.StatusForbidden},
		{"POST", "/v1/projects/A/turns/t1/calls/c1/resolve", auditorA, http.StatusForbidden},
		{"POST", "/v1/projects/A/turns/t1/calls/c1/cancel", approverA, http.StatusForbidden},
		{"POST", "/v1/projects/A/turns/t1/calls/c1/cancel", workerA, http.StatusForbidden},
		{"POST", "/v1/projects/B/turns/t1/calls/c1/resolve", adminA, http.StatusForbidden},
		{"POST", "/v1/projects/A/turns/t1/calls/c1/redrive", adminA, http.StatusTeapot},
		{"POST", "/v1/projects/A/turns/t1/calls/c1/redrive", auditorA, http.StatusForbidden},
		{"POST", "/v1/projects/A/turns/t1/calls/c1/redrive", workerA, http.StatusForbidden},
		{"POST", "/v1/projects/B/turns/t1/calls/c1/redrive", adminA, http.StatusForbidden},
		{"GET", "/v1/projects/A/turns/t1/calls/c1", auditorA, http.StatusTeapot},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tc.token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, tc.want, resp.StatusCode, "%s %s", tc.method, tc.path)
	}
}

// TestAdminOpsAreNoOtherRoles: no role but admin lists an operator action
// among the operations its credential may publish, so NATS refuses them
// to every other credential.
func TestAdminOpsAreNoOtherRoles(t *testing.T) {
	require.ElementsMatch(t, []string{"call.cancel", "call.resolve", "call.redrive", "tool.pause", "tool.resume", "conformance.command", "conformance.observe"}, auth.AdminOps)
	for _, g := range []auth.Grant{
		{Role: auth.RoleWorker, Project: "p"},
		{Role: auth.RoleTool, Project: "p"},
		{Role: auth.RoleAuditor, Project: auth.AllProjects},
		{Role: auth.RoleApprover, Project: "p", Approver: "alice"},
	} {
		pub, _ := g.Permissions("UKEY")
		for _, p := range pub {
			for _, op := range auth.AdminOps {
				require.False(t, strings.HasSuffix(p, "."+op), "%s may publish %s", g.Role, p)
			}
		}
	}
	pub, _ := auth.Grant{Role: auth.RoleAdmin, Project: "p"}.Permissions("UKEY")
	require.Equal(t, []string{"cgledger.v1.p.*.>"}, pub, "an admin's wildcard covers them")
}
