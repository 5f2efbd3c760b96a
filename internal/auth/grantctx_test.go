package auth_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/internal/auth"
)

// TestGrantFromTheVerifiedBearer: the handler behind HTTPPolicy reads the
// grant the policy verified (the approvals' approve and deny act as its
// approver name); a request that did not pass the policy carries none.
func TestGrantFromTheVerifiedBearer(t *testing.T) {
	k, _ := keys(t)
	is, err := k.Issuer()
	require.NoError(t, err)
	v, err := k.Verifier()
	require.NoError(t, err)
	now := time.Now()
	var seen []auth.Grant
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g, ok := auth.GrantFrom(r.Context())
		if ok {
			seen = append(seen, g)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer((&httpapi.Policy{Verifier: v, Now: func() time.Time { return now }}).Wrap(h))
	defer srv.Close()
	want := auth.Grant{Role: auth.RoleAuditor, Project: "A", Label: "ops"}
	c, err := is.Issue(want, time.Hour, now)
	require.NoError(t, err)
	rq, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/projects/A/calls", nil)
	require.NoError(t, err)
	rq.Header.Set("Authorization", "Bearer "+c.JWT)
	resp, err := http.DefaultClient.Do(rq)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Equal(t, []auth.Grant{want}, seen)

	resp, err = http.Get(srv.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, []auth.Grant{want}, seen, "an open path carries no grant")
	_, ok := auth.GrantFrom(httptest.NewRequest(http.MethodGet, "/", nil).Context())
	require.False(t, ok)
}
