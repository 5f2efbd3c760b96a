package projector_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
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

// inboxRig is a ledger with credentials on, its API served, a projector
// following it and answering inbox.list, and the audit HTTP API behind the
// bearer policy serve uses.
type inboxRig struct {
	*ledgertest.Env
	http string
	reg  *prometheus.Registry
}

func newInboxRig(t *testing.T) *inboxRig {
	t.Helper()
	e := ledgertest.NewAuth(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)

	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	reg := prometheus.NewRegistry()
	p, err := projector.New(s, e.JS, projector.Config{BatchSize: 64, Registerer: reg})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	// A minute's wait: a loaded machine must not make a page stale.
	papi, err := p.ServeAPI(ctx, e.NC, e.L, projector.APIConfig{MaxWait: time.Minute})
	require.NoError(t, err)

	v, err := e.Srv.Keys().Verifier()
	require.NoError(t, err)
	// The approver of a POST approve or deny is the verified bearer's, as
	// serve wires it (cmd/cgledger httpApprover): none of the credentials
	// here names one.
	approver := func(r *http.Request) (string, bool) {
		_, ok := auth.GrantFrom(r.Context())
		return "", ok
	}
	hs := httptest.NewServer((&httpapi.Policy{Verifier: v}).Wrap(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{Approver: approver})))
	t.Cleanup(func() {
		hs.Close()
		papi.Stop()
		stop()
		require.NoError(t, <-done)
		require.NoError(t, s.Close())
	})
	return &inboxRig{Env: e, http: hs.URL, reg: reg}
}

// worker is a client on a worker credential, with the violations NATS
// reported to it.
type worker struct {
	cred *auth.Credential
	nc   *nats.Conn
	c    *client.Client
	mu   sync.Mutex
	errs []string
}

func (r *inboxRig) worker(t *testing.T, g auth.Grant) *worker {
	t.Helper()
	w := &worker{cred: r.Srv.Issue(t, g, time.Hour)}
	nc, err := r.Srv.Dial(nats.UserJWTAndSeed(w.cred.JWT, w.cred.Seed), nats.CustomInboxPrefix(w.cred.InboxPrefix),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			w.mu.Lock()
			w.errs = append(w.errs, err.Error())
			w.mu.Unlock()
		}))
	require.NoError(t, err)
	w.nc, w.c = nc, client.New(nc, client.WithActor(g.Agent))
	return w
}

// refused requires that NATS refuses a publish on subject (no answer, and
// a permissions violation reported to the client).
func (w *worker) refused(t *testing.T, subject, body string) {
	t.Helper()
	_, err := w.nc.Request(subject, []byte(body), 500*time.Millisecond)
	require.Error(t, err, "%s must not be answered", subject)
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, e := range w.errs {
			if strings.Contains(e, "Permissions Violation") && strings.Contains(e, `"`+subject+`"`) {
				return true
			}
		}
		return false
	}, time.Minute, 10*time.Millisecond, "no permissions violation for %s", subject)
}

// reply sends a raw inbox.list request and decodes the reply.
func (w *worker) reply(t *testing.T, subject, body string) protocol.APIReply {
	t.Helper()
	m, err := w.nc.Request(subject, []byte(body), 30*time.Second)
	require.NoError(t, err, subject)
	var r protocol.APIReply
	require.NoError(t, json.Unmarshal(m.Data, &r), string(m.Data))
	return r
}

// listAll pages through an agent's pending results with inbox.list.
func (w *worker) listAll(t *testing.T, project, agent string, limit int) ([]string, []protocol.InboxListResult) {
	t.Helper()
	var ids []string
	var pages []protocol.InboxListResult
	cursor := ""
	for range 100 {
		page, err := w.c.ListInbox(ledgertest.Ctx(t), project, agent, cursor, limit)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Items), limit)
		require.GreaterOrEqual(t, page.AsOfSeq, page.LedgerSeq, "the page accounts for every result stored before the request")
		for _, it := range page.Items {
			require.Equal(t, protocol.InboxPending, it.State)
			require.Equal(t, project, it.ProjectID)
			require.Equal(t, agent, it.AgentID)
			ids = append(ids, it.ToolCallID)
		}
		pages = append(pages, page)
		if page.NextCursor == "" {
			return ids, pages
		}
		cursor = page.NextCursor
	}
	t.Fatal("paging does not end")
	return nil, nil
}

func (r *inboxRig) get(t *testing.T, token, path string, out any) int {
	t.Helper()
	rq, err := http.NewRequest(http.MethodGet, r.http+path, nil)
	require.NoError(t, err)
	rq.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(rq)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		var p struct {
			Code string `json:"code"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
		require.NotEmpty(t, p.Code)
		return resp.StatusCode
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	return resp.StatusCode
}

// badRequestFields requires a 400 and returns its violations' fields.
func (r *inboxRig) badRequestFields(t *testing.T, token, path string) []string {
	t.Helper()
	rq, err := http.NewRequest(http.MethodGet, r.http+path, nil)
	require.NoError(t, err)
	rq.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(rq)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	var p struct {
		Violations []protocol.Violation `json:"violations"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	return fields(p.Violations)
}

// TestAWorkerListsItsAgentsPendingResults: a worker that missed wakeups
// finds the results it has not consumed, and only its own agent's, with
// nothing but its worker credential: inbox.list over NATS (paged, fresh up
// to the ledger's last sequence at the request) and the agent's pending
// Inbox over HTTP. Another agent's or another project's are refused, and a
// bad request lists every violation.
func TestAWorkerListsItsAgentsPendingResults(t *testing.T) {
	r := newInboxRig(t)
	ctx := ledgertest.Ctx(t)
	call := func(project, agent, id string) ledgertest.Call {
		return ledgertest.Call{Project: project, Channel: "main", Agent: agent, Turn: "turn-" + agent, ID: id, Epoch: 1, Tool: "echo"}
	}
	for _, a := range []string{"alice", "bob"} {
		_, err := r.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: a, WorkerTarget: "worker-" + a})
		require.NoError(t, err)
	}
	var lastReport uint64
	for _, id := range []string{"a1", "a2", "a3", "a4", "a5"} {
		lastReport = r.Complete(t, call("proj", "alice", id), protocol.StatusSuccess, `{"n":1}`).Seq
	}
	for _, id := range []string{"a2", "a4"} {
		c := call("proj", "alice", id)
		_, err := r.L.Consume(ctx, protocol.ConsumeRequest{ProjectID: c.Project, AgentID: c.Agent, AgentTurnID: c.Turn, ToolCallID: c.ID})
		require.NoError(t, err)
	}
	_, err := r.L.Dispatch(ctx, call("proj", "alice", "a6").Dispatch()) // not reported: not in the Inbox
	require.NoError(t, err)
	r.Complete(t, call("proj", "bob", "b1"), protocol.StatusSuccess, `{"n":1}`)
	r.Complete(t, call("other", "alice", "o1"), protocol.StatusSuccess, `{"n":1}`)

	alice := r.worker(t, auth.Grant{Role: auth.RoleWorker, Project: "proj", Agent: "alice"})

	// Straight after the writes: inbox.list waits for the views to apply
	// what the ledger held, so nothing reported before is missing.
	ids, pages := alice.listAll(t, "proj", "alice", 2)
	require.Equal(t, []string{"a1", "a3", "a5"}, ids)
	require.Len(t, pages, 2)
	require.GreaterOrEqual(t, pages[0].LedgerSeq, lastReport)

	// The cursor is the HTTP API's: the first NATS page continues over HTTP.
	var hp projector.Page[protocol.InboxEntry]
	require.Equal(t, http.StatusOK, r.get(t, alice.cred.JWT, "/v1/projects/proj/agents/alice/inbox?state=pending&limit=2&cursor="+url.QueryEscape(pages[0].NextCursor), &hp))
	require.Len(t, hp.Items, 1)
	require.Equal(t, "a5", hp.Items[0].ToolCallID)
	// A worker's 400, as an admin's, names every parameter problem.
	for _, token := range []string{alice.cred.JWT, r.adminToken(t)} {
		require.ElementsMatch(t, []string{"limit", "cursor"}, r.badRequestFields(t, token, "/v1/projects/proj/agents/alice/inbox?state=pending&limit=5000&cursor=zz"))
	}

	// Processing a result ends with consuming it: it leaves the list.
	a3 := call("proj", "alice", "a3")
	_, err = alice.c.Consume(ctx, protocol.ConsumeRequest{ProjectID: "proj", AgentID: "alice", AgentTurnID: a3.Turn, ToolCallID: a3.ID})
	require.NoError(t, err)
	ids, _ = alice.listAll(t, "proj", "alice", 10)
	require.Equal(t, []string{"a1", "a5"}, ids)
	require.Equal(t, http.StatusOK, r.get(t, alice.cred.JWT, "/v1/projects/proj/agents/alice/inbox?state=pending", &hp))
	require.Len(t, hp.Items, 2)
	require.Equal(t, []string{"a1", "a5"}, []string{hp.Items[0].ToolCallID, hp.Items[1].ToolCallID})

	// Another agent's or another project's: NATS refuses the subject...
	body := func(project, agent string) string {
		return `{"project_id":"` + project + `","agent_id":"` + agent + `"}`
	}
	alice.refused(t, protocol.APISubject("proj", "bob", protocol.OpInboxList), body("proj", "bob"))
	alice.refused(t, protocol.APISubject("other", "alice", protocol.OpInboxList), body("other", "alice"))
	// ...and a body naming them on its own subject is forbidden.
	rep := alice.reply(t, protocol.APISubject("proj", "alice", protocol.OpInboxList), body("other", "bob"))
	require.False(t, rep.OK)
	require.Equal(t, protocol.CodeForbidden, rep.Error.Code)
	require.ElementsMatch(t, []string{"body.project_id", "body.agent_id"}, fields(rep.Error.Violations))
	// HTTP answers 403 for anything but its own agent's pending results.
	for _, path := range []string{
		"/v1/projects/proj/agents/bob/inbox?state=pending",
		"/v1/projects/other/agents/alice/inbox?state=pending",
		"/v1/projects/proj/agents/alice/inbox",
		"/v1/projects/proj/agents/alice/inbox?state=all",
		"/v1/projects/proj/agents/alice/inbox?state=pending&state=all",
		"/v1/projects/proj/agents/alice/roster",
		"/v1/projects/proj/calls",
	} {
		require.Equal(t, http.StatusForbidden, r.get(t, alice.cred.JWT, path, nil), path)
	}

	// Bad input: every violation at once.
	subj := protocol.APISubject("proj", "alice", protocol.OpInboxList)
	rep = alice.reply(t, subj, `{"project_id":"proj","agent_id":"alice","limit":-1,"cursor":"!!"}`)
	require.False(t, rep.OK)
	require.Equal(t, protocol.CodeBadRequest, rep.Error.Code)
	require.ElementsMatch(t, []string{"body.limit", "body.cursor"}, fields(rep.Error.Violations))
	rep = alice.reply(t, subj, `{"project_id":"proj","limit":"ten","cursor":7}`)
	require.Equal(t, protocol.CodeBadRequest, rep.Error.Code)
	require.ElementsMatch(t, []string{"body.agent_id", "body.limit", "body.cursor"}, fields(rep.Error.Violations))
	// A cursor of another listing (the agent's whole Inbox) is not this one's.
	var all projector.Page[protocol.InboxEntry]
	require.Equal(t, http.StatusOK, r.get(t, r.adminToken(t), "/v1/projects/proj/agents/alice/inbox?limit=1", &all))
	require.NotEmpty(t, all.NextCursor)
	rep = alice.reply(t, subj, `{"project_id":"proj","agent_id":"alice","limit":1001,"cursor":"`+all.NextCursor+`"}`)
	require.Equal(t, protocol.CodeBadRequest, rep.Error.Code)
	require.ElementsMatch(t, []string{"body.limit", "body.cursor"}, fields(rep.Error.Violations))

	// A worker bound to no agent acts for any agent of its project (as
	// with every other operation), and of its project only.
	anyAgent := r.worker(t, auth.Grant{Role: auth.RoleWorker, Project: "proj"})
	ids, _ = anyAgent.listAll(t, "proj", "bob", 10)
	require.Equal(t, []string{"b1"}, ids)
	require.Equal(t, http.StatusOK, r.get(t, anyAgent.cred.JWT, "/v1/projects/proj/agents/bob/inbox?state=pending", &hp))
	require.Len(t, hp.Items, 1)
	anyAgent.refused(t, protocol.APISubject("other", "alice", protocol.OpInboxList), body("other", "alice"))
	require.Equal(t, http.StatusForbidden, r.get(t, anyAgent.cred.JWT, "/v1/projects/other/agents/alice/inbox?state=pending", nil))
	otherAlice := r.worker(t, auth.Grant{Role: auth.RoleWorker, Project: "other", Agent: "alice"})
	ids, _ = otherAlice.listAll(t, "other", "alice", 10)
	require.Equal(t, []string{"o1"}, ids)

	// What NATS refused never reached the views; what reached them is
	// counted by outcome.
	requireMetric(t, r.reg, 5, "cgledger_projector_api_requests_total", "op", "inbox.list", "code", "ok")
	requireMetric(t, r.reg, 1, "cgledger_projector_api_requests_total", "op", "inbox.list", "code", "forbidden")
	requireMetric(t, r.reg, 3, "cgledger_projector_api_requests_total", "op", "inbox.list", "code", "bad_request")
}

func (r *inboxRig) adminToken(t *testing.T) string {
	t.Helper()
	return r.Srv.Issue(t, auth.Grant{Role: auth.RoleAdmin, Project: "proj"}, time.Hour).JWT
}

func fields(vs []protocol.Violation) []string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, v.Field)
	}
	return out
}
