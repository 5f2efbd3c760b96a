package auth

import (
	"net/url"
	"testing"
)

func TestAuthorizeMCP(t *testing.T) {
	cases := []struct {
		g     Grant
		path  string
		allow bool
	}{
		{Grant{Role: RoleWorker, Project: "p", Agent: "a"}, "/mcp/p/a", true},
		{Grant{Role: RoleWorker, Project: "p"}, "/mcp/p/anyone", true},
		{Grant{Role: RoleAdmin, Project: "p"}, "/mcp/p/a", true},
		{Grant{Role: RoleAdmin, Project: AllProjects}, "/mcp/p/a", true},
		{Grant{Role: RoleWorker, Project: "p", Agent: "a"}, "/mcp/p/b", false},
		{Grant{Role: RoleWorker, Project: "q", Agent: "a"}, "/mcp/p/a", false},
		{Grant{Role: RoleAuditor, Project: "p"}, "/mcp/p/a", false},
		{Grant{Role: RoleTool, Project: "p", Tool: "a"}, "/mcp/p/a", false},
		{Grant{Role: RoleApprover, Project: "p", Approver: "a"}, "/mcp/p/a", false},
		{Grant{Role: RoleWorker, Project: "p", Agent: "a"}, "/mcp/p", false},
		{Grant{Role: RoleWorker, Project: "p", Agent: "a"}, "/mcp/p/a/x", false},
	}
	for _, c := range cases {
		why := authorizeHTTP(c.g, "POST", c.path, url.Values{})
		if (why == "") != c.allow {
			t.Errorf("%+v %s: allowed=%v (%q), want %v", c.g, c.path, why == "", why, c.allow)
		}
	}
}
