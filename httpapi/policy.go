package httpapi

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/internal/auth"
)

// Policy guards cgledger's HTTP API with the same credentials NATS
// takes: the user JWT of a .creds file as a bearer token, scoped like its
// NATS permissions.
//
//   - /healthz, /readyz, /metrics and /v1/openapi.json are open: they carry
//     no project data.
//   - GET (and HEAD) /, /ui and /ui/... are open: the audit web page's
//     static files (package auditweb) hold no data; every request the page
//     makes to /v1 carries the bearer token and is checked as below.
//   - GET /v1/projects/{project}/...: an auditor or admin of the project.
//   - GET /v1/projects/{project}/agents/{agent}/inbox?state=pending: also a
//     worker of the project, bound to that agent or to none (a worker's
//     recovery of the results whose wakeups it missed).
//   - /v1/... outside a project (digest, verify, export, unrecognized): an
//     auditor or admin of every project ("*").
//   - POST /projects/{project}/tools, POST /projects/{project}/tools/{tool}/pause
//     and .../resume: an admin of the project.
//   - GET /projects/{project}/tools...: any credential of the project.
//   - /mcp/{project}/{agent} (the MCP front door): a worker of the project
//     bound to that agent or to none, or an admin of the project.
type Policy struct {
	Verifier *auth.Verifier
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Wrap returns next behind the policy.
func (p *Policy) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics", "/v1/openapi.json":
			next.ServeHTTP(w, r)
			return
		}
		// A path with empty, "." or ".." segments would be redirected by the
		// router to another path (with an HTML body): refuse it plainly.
		if p := r.URL.EscapedPath(); p != "/" && (strings.Contains(p, "//") || hasDotSegment(p)) {
			writeError(w, http.StatusBadRequest, "bad_request", "the path has empty, \".\" or \"..\" segments: send the canonical path")
			return
		}
		if isWebPage(r.URL.EscapedPath()) {
			// Static files only: any other method is answered 405 by the
			// router, never with data.
			next.ServeHTTP(w, r)
			return
		}
		now := time.Now
		if p.Now != nil {
			now = p.Now
		}
		// The scheme is case-insensitive (RFC 7235).
		tok := ""
		if scheme, rest, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
			tok = rest
		}
		g, err := p.Verifier.Verify(tok, now())
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cgledger"`)
			msg := "a bearer token is required: the user JWT of a credential from `cgledger creds issue`"
			if !errors.Is(err, auth.ErrNoCredential) {
				msg = err.Error()
			}
			writeError(w, http.StatusUnauthorized, "unauthenticated", msg)
			return
		}
		if why := authorizeHTTP(g, r.Method, r.URL.EscapedPath(), r.URL.Query()); why != "" {
			writeError(w, http.StatusForbidden, "forbidden", why)
			return
		}
		next.ServeHTTP(w, r.WithContext(auth.WithGrant(r.Context(), g)))
	})
}

// authorizeHTTP returns why g may not make the request, or "". It splits the
// escaped path, as the router does, and unescapes each segment: splitting
// the decoded path would read /v1/projects/B%2Fx/... as project "B" while
// the router serves project "B/x".
func authorizeHTTP(g auth.Grant, method, escapedPath string, query url.Values) string {
	if g.Role == auth.RoleLedger {
		return ""
	}
	parts := strings.Split(strings.Trim(escapedPath, "/"), "/")
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil {
			return "malformed path"
		}
		parts[i] = u
	}
	readRole := g.Role == auth.RoleAuditor || g.Role == auth.RoleAdmin
	switch {
	case len(parts) >= 1 && parts[0] == "mcp":
		return authorizeMCP(g, parts)
	case isOperatorAction(method, parts):
		if g.Role != auth.RoleAdmin || !g.Allows(parts[2]) {
			return "an operator action (cancel, resolve, redrive) needs an admin credential of project " + parts[2]
		}
	case g.Role == auth.RoleApprover:
		return authorizeApprover(g, method, parts)
	case isApprovalDecision(method, parts):
		return "deciding a held call (approve, deny) needs an approver credential of the project"
	case len(parts) >= 3 && parts[0] == "v1" && parts[1] == "projects" && g.Role == auth.RoleWorker:
		return authorizeWorkerInbox(g, parts, query)
	case len(parts) >= 3 && parts[0] == "v1" && parts[1] == "projects":
		if !readRole || !g.Allows(parts[2]) {
			return "the audit API of project " + parts[2] + " needs an auditor or admin credential of that project"
		}
	case len(parts) >= 1 && parts[0] == "v1":
		if !readRole || g.Project != auth.AllProjects {
			return "this endpoint covers every project: it needs an auditor or admin credential of project \"*\""
		}
	case len(parts) >= 2 && parts[0] == "projects":
		if !g.Allows(parts[1]) {
			return "credential is for project " + g.Project + ", not " + parts[1]
		}
		if method != http.MethodGet && method != http.MethodHead && g.Role != auth.RoleAdmin {
			return "registering, pausing or resuming tools needs an admin credential of the project"
		}
	default:
		if g.Role != auth.RoleAdmin {
			return "needs an admin credential"
		}
	}
	return ""
}

// authorizeMCP lets a worker of the project, bound to the path's agent or
// to none, or an admin of the project, use the MCP front door
// /mcp/{project}/{agent}: its calls are dispatches as that agent, which
// only those may make.
func authorizeMCP(g auth.Grant, parts []string) string {
	const only = "the MCP front door /mcp/{project}/{agent} needs a worker credential of the project (bound to that agent or to none) or an admin credential of it"
	switch {
	case len(parts) != 3:
		return only
	case !g.Allows(parts[1]):
		return "credential is for project " + g.Project + ", not " + parts[1] + ": " + only
	case g.Role == auth.RoleAdmin:
		return ""
	case g.Role != auth.RoleWorker:
		return "a " + string(g.Role) + " credential may not dispatch: " + only
	case g.Agent != "" && g.Agent != parts[2]:
		return "credential is bound to agent " + g.Agent + ", not " + parts[2] + ": " + only
	}
	return ""
}

// isApprovalDecision reports POST /v1/projects/{p}/approvals/{turn}/{call}/approve|deny.
func isApprovalDecision(method string, parts []string) bool {
	return method == http.MethodPost && len(parts) == 7 && parts[0] == "v1" && parts[1] == "projects" && parts[3] == "approvals" &&
		(parts[6] == "approve" || parts[6] == "deny")
}

// isOperatorAction reports POST /v1/projects/{p}/turns/{turn}/calls/{call}/cancel|resolve|redrive.
func isOperatorAction(method string, parts []string) bool {
	return method == http.MethodPost && len(parts) == 8 && parts[0] == "v1" && parts[1] == "projects" && parts[3] == "turns" &&
		parts[5] == "calls" && (parts[7] == "cancel" || parts[7] == "resolve" || parts[7] == "redrive")
}

// authorizeApprover lets an approver use its project's approvals and
// nothing else: list and read them, approve and deny.
func authorizeApprover(g auth.Grant, method string, parts []string) string {
	const only = "an approver credential may use only its project's approvals: GET /v1/projects/{project}/approvals, GET /v1/projects/{project}/approvals/{turn}/{call}, POST /v1/projects/{project}/approvals/{turn}/{call}/approve or /deny"
	if len(parts) < 4 || parts[0] != "v1" || parts[1] != "projects" || parts[3] != "approvals" {
		return only
	}
	if !g.Allows(parts[2]) {
		return "credential is for project " + g.Project + ", not " + parts[2]
	}
	read := method == http.MethodGet || method == http.MethodHead
	if (read && (len(parts) == 4 || len(parts) == 6)) || isApprovalDecision(method, parts) {
		return ""
	}
	return only
}

// authorizeWorkerInbox lets a worker read one thing of the audit API: the
// pending results of its own agent (any agent of its project when it is
// bound to none, as on NATS), the same page inbox.list answers.
func authorizeWorkerInbox(g auth.Grant, parts []string, query url.Values) string {
	const only = "a worker credential may read only its agent's pending results, GET /v1/projects/{project}/agents/{agent}/inbox?state=pending; the rest of the audit API needs an auditor or admin credential"
	switch {
	case !g.Allows(parts[2]):
		return "credential is for project " + g.Project + ", not " + parts[2] + ": " + only
	case len(parts) != 6 || parts[3] != "agents" || parts[5] != "inbox":
		return only
	case g.Agent != "" && parts[4] != g.Agent:
		return "credential is bound to agent " + g.Agent + ", not " + parts[4] + ": " + only
	case len(query["state"]) != 1 || query.Get("state") != "pending":
		return "state must be pending: " + only
	}
	return ""
}

// isWebPage reports whether a path is the audit web page's: / (which
// redirects to /ui/), /ui, or under /ui/.
func isWebPage(escapedPath string) bool {
	return escapedPath == "/" || escapedPath == "/ui" || strings.HasPrefix(escapedPath, "/ui/")
}

func hasDotSegment(escapedPath string) bool {
	for _, seg := range strings.Split(escapedPath, "/") {
		if u, err := url.PathUnescape(seg); err != nil || u == "." || u == ".." {
			return true
		}
	}
	return false
}

// writeError answers a refusal as problem details (httpapi/problem),
// the shape of every other error of the HTTP API.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	problem.Write(w, problem.New(status, code, msg, nil))
}

// MCPProblem says why g may not use the MCP front door of project and
// agent, or "": the rule of /mcp/{project}/{agent}, which `cgledger mcp
// serve` checks at start against its own credential.
func MCPProblem(g auth.Grant, project, agent string) string {
	return authorizeMCP(g, []string{"mcp", project, agent})
}
