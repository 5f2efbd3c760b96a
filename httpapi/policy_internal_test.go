package httpapi

import (
	"net/url"
	"testing"

	"github.com/cgledger/cgledger/internal/auth"
)

func TestAuthorizeMCP(t *testing.T) {
	cases := []struct {
		g     auth.Grant
		path  string
		allow bool
	}{
		{auth.Grant{Role: auth.RoleWorker, Project: "p", Agent: "a"}, "/mcp/p/a", true},
		{auth.Grant{Role: auth.RoleWorker, Project: "p"}, "/mcp/p/anyone", true},
		{auth.Grant{Role: auth.RoleAdmin, Project: "p"}, "/mcp/p/a", true},
		{auth.Grant{Role: auth.RoleAdmin, Project: auth.AllProjects}, "/mcp/p/a", true},
		{auth.Grant{Role: auth.RoleWorker, Project: "p", Agent: "a"}, "/mcp/p/b", false},
		{auth.Grant{Role: auth.RoleWorker, Project: "q", Agent: "a"}, "/mcp/p/a", false},
		{auth.Grant{Role: auth.RoleAuditor, Project: "p"}, "/mcp/p/a", false},
		{auth.Grant{Role: auth.RoleTool, Project: "p", Tool: "a"}, "/mcp/p/a", false},
		{auth.Grant{Role: auth.RoleApprover, Project: "p", Approver: "a"}, "/mcp/p/a", false},
		{auth.Grant{Role: auth.RoleWorker, Project: "p", Agent: "a"}, "/mcp/p", false},
		{auth.Grant{Role: auth.RoleWorker, Project: "p", Agent: "a"}, "/mcp/p/a/x", false},
	}
	for _, c := range cases {
		why := authorizeHTTP(c.g, "POST", c.path, url.Values{})
		if (why == "") != c.allow {
			t.Errorf("%+v %s: allowed=%v (%q), want %v", c.g, c.path, why == "", why, c.allow)
		}
	}
}
