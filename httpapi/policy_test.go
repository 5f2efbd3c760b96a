package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

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

func TestHTTPPolicy(t *testing.T) {
	k, _ := keys(t)
	is, err := k.Issuer()
	require.NoError(t, err)
	v, err := k.Verifier()
	require.NoError(t, err)
	now := time.Now()
	pol := &httpapi.Policy{Verifier: v, Now: func() time.Time { return now }}
	srv := httptest.NewServer(pol.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })))
	defer srv.Close()
	tok := func(g auth.Grant, ttl time.Duration) string {
		c, err := is.Issue(g, ttl, now)
		require.NoError(t, err)
		return c.JWT
	}
	other, _ := auth.LoadOrCreateKeys(filepath.Join(t.TempDir(), "other"))
	ois, _ := other.Issuer()
	foreign, _ := ois.Issue(auth.Grant{Role: auth.RoleAdmin, Project: "*"}, time.Hour, now)
	expired, _ := is.Issue(auth.Grant{Role: auth.RoleAdmin, Project: "*"}, time.Hour, now.Add(-2*time.Hour))

	adminA := tok(auth.Grant{Role: auth.RoleAdmin, Project: "A"}, time.Hour)
	auditorA := tok(auth.Grant{Role: auth.RoleAuditor, Project: "A"}, time.Hour)
	auditorAll := tok(auth.Grant{Role: auth.RoleAuditor, Project: "*"}, time.Hour)
	workerA := tok(auth.Grant{Role: auth.RoleWorker, Project: "A"}, time.Hour)
	workerAx := tok(auth.Grant{Role: auth.RoleWorker, Project: "A", Agent: "x"}, time.Hour)
	for _, tc := range []struct {
		method, path, token string
		want                int
	}{
		{"GET", "/healthz", "", http.StatusTeapot},
		{"GET", "/metrics", "", http.StatusTeapot},
		{"GET", "/v1/projects/A/calls", "", http.StatusUnauthorized},
		{"GET", "/v1/projects/A/calls", "garbage", http.StatusUnauthorized},
		{"GET", "/v1/projects/A/calls", foreign.JWT, http.StatusUnauthorized},
		{"GET", "/v1/projects/A/calls", expired.JWT, http.StatusUnauthorized},
		{"GET", "/v1/projects/A/calls", auditorA, http.StatusTeapot},
		{"GET", "/v1/projects/B/calls", auditorA, http.StatusForbidden},
		{"GET", "/v1/projects/A/calls", workerA, http.StatusForbidden},
		{"GET", "/v1/projects/B/calls", auditorAll, http.StatusTeapot},
		{"GET", "/v1/export", auditorA, http.StatusForbidden},
		{"GET", "/v1/export", auditorAll, http.StatusTeapot},
		{"POST", "/projects/A/tools", workerA, http.StatusForbidden},
		{"POST", "/projects/A/tools", auditorA, http.StatusForbidden},
		{"POST", "/projects/B/tools", adminA, http.StatusForbidden},
		{"POST", "/projects/A/tools", adminA, http.StatusTeapot},
		{"GET", "/projects/A/tools", workerA, http.StatusTeapot},
		// Pausing and resuming a tool: an admin of the project only.
		{"POST", "/projects/A/tools/wire/pause", adminA, http.StatusTeapot},
		{"POST", "/projects/A/tools/wire/resume", adminA, http.StatusTeapot},
		{"POST", "/projects/A/tools/wire/pause", auditorA, http.StatusForbidden},
		{"POST", "/projects/A/tools/wire/resume", workerA, http.StatusForbidden},
		{"POST", "/projects/B/tools/wire/pause", adminA, http.StatusForbidden},
		// A worker reads its agent's pending results, and nothing else of
		// the audit API; one bound to no agent, any agent's of its project.
		{"GET", "/v1/projects/A/agents/x/inbox?state=pending", workerAx, http.StatusTeapot},
		{"GET", "/v1/projects/A/agents/x/inbox?state=pending&limit=5&cursor=abc", workerAx, http.StatusTeapot},
		{"GET", "/v1/projects/A/agents/y/inbox?state=pending", workerA, http.StatusTeapot},
		{"GET", "/v1/projects/A/agents/y/inbox?state=pending", workerAx, http.StatusForbidden},
		{"GET", "/v1/projects/B/agents/x/inbox?state=pending", workerAx, http.StatusForbidden},
		{"GET", "/v1/projects/B/agents/x/inbox?state=pending", workerA, http.StatusForbidden},
		{"GET", "/v1/projects/A/agents/x/inbox", workerAx, http.StatusForbidden},
		{"GET", "/v1/projects/A/agents/x/inbox?state=consumed", workerAx, http.StatusForbidden},
		{"GET", "/v1/projects/A/agents/x/inbox?state=pending&state=all", workerAx, http.StatusForbidden},
		{"GET", "/v1/projects/A/agents/x/inbox/more?state=pending", workerAx, http.StatusForbidden},
		{"GET", "/v1/projects/A/agents/x/roster?state=pending", workerAx, http.StatusForbidden},
		{"GET", "/v1/projects/A/agents/x%2Fy/inbox?state=pending", workerAx, http.StatusForbidden},
		{"GET", "/v1/digest", workerA, http.StatusForbidden},
		{"GET", "/projects/B/tools", workerA, http.StatusForbidden},
		// An escaped slash is part of the project id, as the router reads it.
		{"GET", "/v1/projects/A%2Fx/calls", auditorA, http.StatusForbidden},
		{"POST", "/projects/A%2Fx/tools", adminA, http.StatusForbidden},
		{"GET", "/v1/projects/A%2F%2E%2E%2FB/calls", auditorA, http.StatusForbidden},
		{"GET", "/v1/projects/A/../B/calls", auditorA, http.StatusBadRequest},
		{"GET", "/v1/projects/A/%2E%2E/B/calls", auditorA, http.StatusBadRequest},
		{"GET", "/v1//projects/A/calls", auditorA, http.StatusBadRequest},
		// The audit web page's static files are open (the router answers
		// other methods 405); its data requests to /v1 are checked like
		// the ones above.
		{"GET", "/", "", http.StatusTeapot},
		{"GET", "/ui", "", http.StatusTeapot},
		{"GET", "/ui/", "", http.StatusTeapot},
		{"HEAD", "/ui/", "", http.StatusTeapot},
		{"GET", "/ui/app.js", "", http.StatusTeapot},
		{"GET", "/ui/app.js", "garbage", http.StatusTeapot},
		{"POST", "/ui/", "", http.StatusTeapot},
		{"GET", "/uix", "", http.StatusUnauthorized},
		{"GET", "/ui%2Fx", "", http.StatusUnauthorized},
		{"GET", "/index.html", "", http.StatusUnauthorized},
		{"GET", "/ui/../v1/digest", "", http.StatusBadRequest},
		{"GET", "/ui/%2E%2E/v1/digest", "", http.StatusBadRequest},
		{"GET", "/ui//v1/digest", "", http.StatusBadRequest},
		{"GET", "/v1/digest", "", http.StatusUnauthorized},
		{"GET", "/v1/projects/A/calls", "", http.StatusUnauthorized},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		require.NoError(t, err)
		if tc.token != "" {
			req.Header.Set("Authorization", "bEaReR "+tc.token) // the scheme is case-insensitive
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, tc.want, resp.StatusCode, "%s %s", tc.method, tc.path)
	}
}
