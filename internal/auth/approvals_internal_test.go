package auth

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestApprovalsPolicy: an approver of the project reads and decides its
// approvals and nothing else of the audit API; auditors and admins read
// them but may not decide; credentials of another project do neither.
func TestApprovalsPolicy(t *testing.T) {
	approver := Grant{Role: roleApprover, Project: "p"}
	auditor := Grant{Role: RoleAuditor, Project: "p"}
	everyAuditor := Grant{Role: RoleAuditor, Project: AllProjects}
	admin := Grant{Role: RoleAdmin, Project: "p"}
	worker := Grant{Role: RoleWorker, Project: "p"}
	otherApprover := Grant{Role: roleApprover, Project: "q"}
	const list, one = "/v1/projects/p/approvals", "/v1/projects/p/approvals/t1/c1"
	for _, c := range []struct {
		g       Grant
		method  string
		path    string
		allowed bool
	}{
		{approver, http.MethodGet, list, true},
		{approver, http.MethodGet, one, true},
		{approver, http.MethodPost, one + "/approve", true},
		{approver, http.MethodPost, one + "/deny", true},
		{approver, http.MethodGet, "/v1/projects/p/calls", false},
		{approver, http.MethodGet, "/v1/digest", false},
		{approver, http.MethodPost, "/projects/p/tools", false},
		{otherApprover, http.MethodGet, list, false},
		{otherApprover, http.MethodPost, one + "/approve", false},
		{auditor, http.MethodGet, list, true},
		{everyAuditor, http.MethodGet, one, true},
		{auditor, http.MethodPost, one + "/approve", false},
		{admin, http.MethodGet, list, true},
		{admin, http.MethodPost, one + "/deny", false},
		{worker, http.MethodGet, list, false},
		{worker, http.MethodPost, one + "/approve", false},
	} {
		why := authorizeHTTP(c.g, c.method, c.path, nil)
		require.Equal(t, c.allowed, why == "", "%s %s %s: %q", c.g.Role, c.method, c.path, why)
	}
}
