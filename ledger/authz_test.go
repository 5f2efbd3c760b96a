package ledger_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// authEnv is a ledger on a server that enforces credentials, as serve runs by
// default, with the API served.
type authEnv struct {
	*env
	js jetstream.JetStream
}

func newAuthEnv(t *testing.T) *authEnv {
	t.Helper()
	e := newEnv(t, natstest.WithAuth())
	serveAPI(t, e)
	js, err := jetstream.New(e.nc)
	require.NoError(t, err)
	return &authEnv{env: e, js: js}
}

// natsClient is a connection under one credential that records the permission
// violations NATS reports to it.
type natsClient struct {
	nc   *nats.Conn
	cred *auth.Credential
	mu   sync.Mutex
	errs []string
}

func (e *authEnv) client(t *testing.T, g auth.Grant) *natsClient {
	t.Helper()
	c := &natsClient{cred: e.srv.Issue(t, g, time.Hour)}
	nc, err := e.srv.Dial(nats.UserJWTAndSeed(c.cred.JWT, c.cred.Seed), nats.CustomInboxPrefix(c.cred.InboxPrefix),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			c.errs = append(c.errs, err.Error())
			c.mu.Unlock()
		}))
	require.NoError(t, err)
	c.nc = nc
	return c
}

// denied waits until NATS has reported a permission violation naming subject.
func (c *natsClient) denied(t *testing.T, subject string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, e := range c.errs {
			if strings.Contains(e, "Permissions Violation") && strings.Contains(e, `"`+subject+`"`) {
				return true
			}
		}
		return false
	}, time.Minute, 10*time.Millisecond, "no permission violation for %s", subject)
}

// request sends an API request and decodes the reply.
func (c *natsClient) request(t *testing.T, subject string, h nats.Header, body string) rawReply {
	t.Helper()
	resp, err := c.nc.RequestMsg(&nats.Msg{Subject: subject, Header: h, Data: []byte(body)}, 10*time.Second)
	require.NoError(t, err, subject)
	var r rawReply
	require.NoError(t, json.Unmarshal(resp.Data, &r), string(resp.Data))
	return r
}

// refusedByNATS publishes a request NATS must not deliver and checks that it
// was reported as a violation and nothing reached the ledger.
func (e *authEnv) refusedByNATS(t *testing.T, c *natsClient, subject string, h nats.Header, body string) {
	t.Helper()
	before := e.lastSeq(t)
	// Expected to go unanswered: the wait is short, the proof is the
	// violation NATS reports.
	_, err := c.nc.RequestMsg(&nats.Msg{Subject: subject, Header: h, Data: []byte(body)}, 500*time.Millisecond)
	require.Error(t, err, "%s must not be answered", subject)
	c.denied(t, subject)
	require.Equal(t, before, e.lastSeq(t), "nothing was written for %s", subject)
}

func (e *authEnv) lastSeq(t *testing.T) uint64 {
	t.Helper()
	s, err := e.js.Stream(ctxT(t), stream.DefaultName)
	require.NoError(t, err)
	info, err := s.Info(ctxT(t))
	require.NoError(t, err)
	return info.State.LastSeq
}

func dispatchBodyFor(c call, args string) string {
	card := c.card
	card.Content = json.RawMessage(`{"tool_name":"echo","arguments":` + args + `}`)
	cb, _ := json.Marshal(card)
	return `{"subject":"` + protocol.ToolCommandSubject("v1", project, channel, "echo") + `","card":` + string(cb) +
		`,"payload":{"tool_call_card_id":"` + c.card.CardID + `","tool_name":"echo","after_execution":"suspend"}}`
}

func TestAuthNoCredentialOrForeignOrExpiredCredentialCannotConnect(t *testing.T) {
	e := newAuthEnv(t)
	_, err := e.srv.Dial()
	require.Error(t, err, "anonymous connection")

	expired, err := func() (*auth.Credential, error) {
		is, err := e.srv.Keys().Issuer()
		if err != nil {
			return nil, err
		}
		return is.Issue(auth.Grant{Role: auth.RoleAdmin, Project: project}, time.Hour, time.Now().Add(-2*time.Hour))
	}()
	require.NoError(t, err)
	_, err = e.srv.Dial(nats.UserJWTAndSeed(expired.JWT, expired.Seed))
	require.Error(t, err, "expired credential")

	other := natstest.Start(t, natstest.WithAuth())
	foreign := other.Issue(t, auth.Grant{Role: auth.RoleAdmin, Project: auth.AllProjects}, time.Hour)
	_, err = e.srv.Dial(nats.UserJWTAndSeed(foreign.JWT, foreign.Seed))
	require.Error(t, err, "credential of another ledger")
}

// TestAuthNoClientWritesOrDeletesTheLedger: every client role is refused by
// NATS itself on the ledger's stream subjects, its bucket and the JetStream
// API; the stream and its entries survive.
func TestAuthNoClientWritesOrDeletesTheLedger(t *testing.T) {
	e := newAuthEnv(t)
	c := newCall("t1", "k1", 1)
	e.dispatchAndResult(t, c, protocol.StatusSuccess)
	for _, g := range []auth.Grant{
		{Role: auth.RoleWorker, Project: project},
		{Role: auth.RoleTool, Project: project, Tool: "echo"},
		{Role: auth.RoleAuditor, Project: auth.AllProjects},
		{Role: auth.RoleAdmin, Project: auth.AllProjects},
	} {
		t.Run(string(g.Role), func(t *testing.T) {
			cl := e.client(t, g)
			forged := nats.Header{}
			forged.Set(protocol.HeaderEntryKind, "bogus")
			for _, subj := range []string{
				protocol.ReportSubject("v1", project, channel, c.turn, c.id),    // a forged report
				"cg.v1." + project + ".anything",                                // any entry
				protocol.ToolCommandSubject("v1", project, channel, "echo"),     // a raw command
				"$JS.API.STREAM.DELETE." + stream.DefaultName,                   // delete the ledger
				"$JS.API.STREAM.PURGE." + stream.DefaultName,                    // purge it
				"$JS.API.STREAM.UPDATE." + stream.DefaultName,                   // edit it
				"$JS.API.STREAM.MSG.DELETE." + stream.DefaultName,               // delete one entry
				"$JS.API.CONSUMER.DELETE." + stream.DefaultName + ".cgledger-x", // delete a consumer
				"$KV.CG_CALLS.x",                                // write the call bucket
				"$JS.API.STREAM.DELETE.KV_CG_CALLS",             // delete it
				"$JS.API.CONSUMER.CREATE." + stream.DefaultName, // read everything
			} {
				err := cl.nc.PublishMsg(&nats.Msg{Subject: subj, Header: forged, Data: []byte(`{}`)})
				require.NoError(t, err)
				cl.denied(t, subj)
			}
			_, err := e.js.Stream(ctxT(t), stream.DefaultName)
			require.NoError(t, err, "the ledger stream survives")
			rec, err := e.l.GetCall(ctxT(t), project, c.turn, c.id)
			require.NoError(t, err)
			require.Equal(t, protocol.StateDispatched, rec.State, "no forged report was accepted")
		})
	}
}

// TestAuthProjectIsolation: a credential of project B cannot reach project
// A's API (NATS refuses), and a request on B's own subjects naming A is
// refused by the ledger and recorded.
func TestAuthProjectIsolation(t *testing.T) {
	e := newAuthEnv(t)
	c := newCall("t1", "k1", 1)
	ctx := ctxT(t)
	_, err := e.l.Dispatch(ctx, protocol.DispatchRequest{Subject: c.dispatchReq().Subject, Identity: c.identity(),
		Card: func() protocol.Card {
			card := c.card
			card.Content = json.RawMessage(`{"tool_name":"echo","arguments":{"api_key":"sk-secret-A"}}`)
			return card
		}(), Payload: c.dispatchReq().Payload})
	require.NoError(t, err)
	rc := c.resultCard(protocol.StatusSuccess)
	_, err = e.l.PutCard(ctx, rc)
	require.NoError(t, err)

	const other = "proj-B"
	bWorker := e.client(t, auth.Grant{Role: auth.RoleWorker, Project: other})
	bTool := e.client(t, auth.Grant{Role: auth.RoleTool, Project: other, Tool: "echo"})
	bAdmin := e.client(t, auth.Grant{Role: auth.RoleAdmin, Project: other})

	cardGet := `{"project_id":"` + project + `","card_ids":["` + c.card.CardID + `"]}`
	callGet := `{"project_id":"` + project + `","agent_turn_id":"t1","tool_call_id":"k1"}`
	// NATS: B's credentials do not reach A's subjects at all.
	e.refusedByNATS(t, bWorker, protocol.APISubject(project, agent, protocol.OpCardGet), nil, cardGet)
	e.refusedByNATS(t, bWorker, protocol.APISubject(project, agent, protocol.OpCallGet), nil, callGet)
	e.refusedByNATS(t, bWorker, protocol.APISubject(project, agent, protocol.OpConsume), nil, `{}`)
	e.refusedByNATS(t, bWorker, protocol.APISubject(project, agent, protocol.OpCancel), nil, `{}`)
	e.refusedByNATS(t, bWorker, protocol.APISubject(project, agent, protocol.OpRosterSet), nil, `{}`)
	e.refusedByNATS(t, bTool, protocol.APISubject(project, "echo", protocol.OpReport), nil, `{}`)
	e.refusedByNATS(t, bTool, protocol.APISubject(project, "echo", protocol.OpCardPut), nil, `{}`)
	e.refusedByNATS(t, bAdmin, protocol.APISubject(project, "ops", protocol.OpToolRegister), nil, `tool_name: echo`)
	// Nor can B listen to A's replies, commands or wakeups.
	for _, subj := range []string{"_INBOX.>", "cg.>", "cg.v1." + project + ".*.cmd.tool.echo", "cg.v1." + project + ".*.cmd.agent.*.wakeup"} {
		_, err := bWorker.nc.SubscribeSync(subj)
		require.NoError(t, err)
		bWorker.denied(t, subj)
	}

	// The ledger: on B's own subjects, naming A is forbidden and recorded.
	r := bWorker.request(t, protocol.APISubject(other, agent, protocol.OpCardGet), nil, cardGet)
	require.False(t, r.OK)
	require.Equal(t, "forbidden", r.Error.Code)
	require.NotContains(t, string(r.Result), "sk-secret-A")
	r = bWorker.request(t, protocol.APISubject(other, agent, protocol.OpConsume), nil,
		`{"project_id":"`+project+`","agent_id":"`+agent+`","agent_turn_id":"t1","tool_call_id":"k1"}`)
	require.Equal(t, "forbidden", r.Error.Code)
	require.NotZero(t, r.Error.RejectionSeq, "a refused write is recorded")
	rh := reportHeader(c)
	r = bTool.request(t, protocol.APISubject(other, "echo", protocol.OpReport), rh,
		`{"status":"success","after_execution":"suspend","tool_result_card_id":"`+rc.CardID+`"}`)
	require.Equal(t, "forbidden", r.Error.Code)
	var vs []string
	for _, v := range r.Error.Violations {
		vs = append(vs, v.Field+"/"+v.Code)
	}
	require.Equal(t, []string{"header.CG-Project-Id/forbidden"}, vs)

	rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State, "A's call is untouched")
}

// TestAuthActorScopes: a worker acts only as its agent, a tool reports only
// calls dispatched to it, an auditor only reads; entries record the actor.
func TestAuthActorScopes(t *testing.T) {
	e := newAuthEnv(t)
	alice := e.client(t, auth.Grant{Role: auth.RoleWorker, Project: project, Agent: agent})
	c := newCall("t1", "k1", 1)
	h := nats.Header{}
	c.identity().Apply(h)
	body := dispatchBodyFor(c, `{"text":"hi"}`)

	// As another agent: NATS refuses the subject; the ledger refuses a
	// header naming another agent on alice's own subject.
	e.refusedByNATS(t, alice, protocol.APISubject(project, "mallory", protocol.OpDispatch), h, body)
	mh := nats.Header{}
	for k, v := range h {
		mh[k] = v
	}
	mh.Set(protocol.HeaderAgentID, "mallory")
	r := alice.request(t, protocol.APISubject(project, agent, protocol.OpDispatch), mh, body)
	require.Equal(t, "forbidden", r.Error.Code)
	require.Equal(t, "header.CG-Agent-Id", r.Error.Violations[0].Field)

	r = alice.request(t, protocol.APISubject(project, agent, protocol.OpDispatch), h, body)
	require.True(t, r.OK, "%+v", r.Error)
	cmd := e.subjectEntries(t, protocol.ToolCommandSubject("v1", project, channel, "echo"))
	require.Len(t, cmd, 1)
	require.Equal(t, agent, cmd[0].Header.Get(protocol.HeaderActor), "the command records who dispatched it")

	// A repeated key is a bad_request whichever value comes last, never a
	// forbidden decided by the last value.
	for _, body := range []string{
		`{"project_id":"other","project_id":"` + project + `","agent_id":"` + agent + `","agent_turn_id":"t1","tool_call_id":"k1"}`,
		`{"project_id":"` + project + `","project_id":"other","agent_id":"` + agent + `","agent_turn_id":"t1","tool_call_id":"k1"}`,
	} {
		r := alice.request(t, protocol.APISubject(project, agent, protocol.OpConsume), nil, body)
		require.Equal(t, "bad_request", r.Error.Code, body)
		require.Equal(t, "body.project_id", r.Error.Violations[0].Field, body)
		require.Equal(t, protocol.VDuplicate, r.Error.Violations[0].Code, body)
		// The refusal is the caller's project's, whatever copy names
		// another project: nobody writes into another project's views.
		js, err := e.nc.JetStream()
		require.NoError(t, err)
		m, err := js.GetMsg(stream.DefaultName, r.Error.RejectionSeq)
		require.NoError(t, err)
		require.Equal(t, project, m.Header.Get(protocol.HeaderProjectID), body)
	}

	// A worker does not report; an auditor does not write.
	e.refusedByNATS(t, alice, protocol.APISubject(project, agent, protocol.OpReport), nil, `{}`)
	aud := e.client(t, auth.Grant{Role: auth.RoleAuditor, Project: project})
	e.refusedByNATS(t, aud, protocol.APISubject(project, "x", protocol.OpCardPut), nil, `{}`)
	r = aud.request(t, protocol.APISubject(project, "x", protocol.OpCallGet), nil, `{"project_id":"`+project+`","agent_turn_id":"t1","tool_call_id":"k1"}`)
	require.True(t, r.OK, "an auditor reads")

	// Another tool of the same project cannot report echo's call.
	rc := c.resultCard(protocol.StatusSuccess)
	_, err := e.l.PutCard(ctxT(t), rc)
	require.NoError(t, err)
	rh := reportHeader(c)
	report := `{"status":"success","after_execution":"suspend","tool_result_card_id":"` + rc.CardID + `"}`
	spoof := e.client(t, auth.Grant{Role: auth.RoleTool, Project: project, Tool: "spoof"})
	r = spoof.request(t, protocol.APISubject(project, "spoof", protocol.OpReport), rh, report)
	require.Equal(t, "forbidden", r.Error.Code)
	require.NotZero(t, r.Error.RejectionSeq)
	e.refusedByNATS(t, spoof, protocol.APISubject(project, "echo", protocol.OpReport), rh, report)

	// The echo tool can, and its report records it.
	echo := e.client(t, auth.Grant{Role: auth.RoleTool, Project: project, Tool: "echo"})
	r = echo.request(t, protocol.APISubject(project, "echo", protocol.OpReport), rh, report)
	require.True(t, r.OK, "%+v", r.Error)
	rep := e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, rep, 1)
	require.Equal(t, "echo", rep[0].Header.Get(protocol.HeaderActor))
}

// TestAuthToolPullsOnlyItsOwnConsumer: a tool credential gets durable
// commands from the consumer the ledger keeps for it, and from no other.
func TestAuthToolPullsOnlyItsOwnConsumer(t *testing.T) {
	e := newAuthEnv(t)
	echo := e.client(t, auth.Grant{Role: auth.RoleTool, Project: project, Tool: "echo"})
	cl := client.New(echo.nc, client.WithActor("echo"))
	_, err := cl.EnsureToolConsumer(ctxT(t), project, "echo")
	require.ErrorIs(t, err, protocol.ErrNotFound, "only registered tools get a consumer")
	registerEcho(t, e)
	tc, err := cl.EnsureToolConsumer(ctxT(t), project, "echo")
	require.NoError(t, err)
	require.Equal(t, auth.ToolConsumerName(project, "echo"), tc.Consumer)

	c := newCall("t1", "k1", 1)
	_, err = e.l.Dispatch(ctxT(t), c.dispatchReq())
	require.NoError(t, err)

	js, err := jetstream.NewWithAPIPrefix(echo.nc, tc.APIPrefix)
	require.NoError(t, err)
	cons, err := js.Consumer(ctxT(t), tc.Stream, tc.Consumer)
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(30*time.Second))
	require.NoError(t, err)
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
		require.NoError(t, m.Ack())
	}
	require.Len(t, got, 1)
	require.Equal(t, c.id, got[0].Headers().Get(protocol.HeaderToolCallID))
	// The ack crossed into the ledger's account.
	ledgerCons, err := e.js.Consumer(ctxT(t), tc.Stream, tc.Consumer)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := ledgerCons.Info(ctxT(t))
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream > 0
	}, time.Minute, 20*time.Millisecond)

	// Another project's tool consumer, or creating one, is out of reach.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = js.Consumer(ctx, tc.Stream, auth.ToolConsumerName("proj-B", "echo"))
	require.Error(t, err)
	echo.denied(t, tc.APIPrefix+".CONSUMER.INFO."+tc.Stream+"."+auth.ToolConsumerName("proj-B", "echo"))
	_, err = js.CreateOrUpdateConsumer(ctx, tc.Stream, jetstream.ConsumerConfig{Durable: "mine"})
	require.Error(t, err)
}

// TestAuthProjectorSkipNeedsAnAdminOfEveryProject: the global skip is only
// for an admin of "*", and it records who decided.
func TestAuthProjectorSkipNeedsAnAdminOfEveryProject(t *testing.T) {
	e := newAuthEnv(t)
	c := newCall("t1", "k1", 1)
	e.dispatchAndResult(t, c, protocol.StatusSuccess)
	body := `{"seq":1,"reason":"test"}`
	subject := protocol.APISubject("_", "oncall", protocol.OpProjectorSkip)
	projAdmin := e.client(t, auth.Grant{Role: auth.RoleAdmin, Project: project})
	e.refusedByNATS(t, projAdmin, subject, nil, body)
	auditor := e.client(t, auth.Grant{Role: auth.RoleAuditor, Project: auth.AllProjects})
	e.refusedByNATS(t, auditor, subject, nil, body)

	admin := e.client(t, auth.Grant{Role: auth.RoleAdmin, Project: auth.AllProjects})
	r := admin.request(t, protocol.APISubject(project, "oncall", protocol.OpProjectorSkip), nil, body)
	require.Equal(t, "bad_request", r.Error.Code, "a project-scoped subject is not the skip's")
	r = admin.request(t, subject, nil, `{"seq":"x"}`)
	require.Equal(t, "bad_request", r.Error.Code)
	require.Len(t, r.Error.Violations, 2, "seq and reason")
	res, err := client.New(admin.nc, client.WithActor("oncall")).Skip(ctxT(t), 1, "test")
	require.NoError(t, err)
	entries := e.subjectEntries(t, protocol.SkipSubject("v1", 1))
	require.Len(t, entries, 1)
	require.Equal(t, "oncall", entries[0].Header.Get(protocol.HeaderActor))
	require.Equal(t, mustSeq(t, entries[0]), res.SkipSeq)
}

// reportHeader is the header of c's report, as the echo tool sends it.
func reportHeader(c call) nats.Header {
	h := nats.Header{}
	c.identity().Apply(h)
	h.Set(protocol.HeaderProjectID, project)
	h.Set(protocol.HeaderChannelID, channel)
	h.Set(protocol.HeaderSourceID, source)
	h.Set(protocol.HeaderSourceFunction, toolFn)
	return h
}

// TestAuthReplySubjectsCannotReachTheLedger: NATS answers a request on the
// reply subject the requester chose. Clients live in their project's
// account, not the ledger's, so no answer (the ledger's, JetStream's, a
// pulled command) to a client can land on a ledger subject: it lands in the
// project's account, where a spy sees it and the stream does not.
func TestAuthReplySubjectsCannotReachTheLedger(t *testing.T) {
	e := newAuthEnv(t)
	c := newCall("t1", "k1", 1)
	_, err := e.l.Dispatch(ctxT(t), c.dispatchReq())
	require.NoError(t, err)
	evil := "cg.v1." + project + ".card.evil"
	witness, err := e.nc.SubscribeSync(evil) // in the ledger's account
	require.NoError(t, err)
	require.NoError(t, e.nc.Flush())

	// A spy in the project's own account, allowed to see everything there.
	worker := e.client(t, auth.Grant{Role: auth.RoleWorker, Project: project}) // makes the account known
	spyNC := e.spy(t, project)
	spy, err := spyNC.SubscribeSync(evil)
	require.NoError(t, err)
	require.NoError(t, spyNC.Flush())

	echo := e.client(t, auth.Grant{Role: auth.RoleTool, Project: project, Tool: "echo"})
	registerEcho(t, e)
	tc, err := client.New(echo.nc, client.WithActor("echo")).EnsureToolConsumer(ctxT(t), project, "echo")
	require.NoError(t, err)
	before := e.lastSeq(t)

	cardGet := `{"project_id":"` + project + `","card_ids":["` + c.card.CardID + `"]}`
	for _, m := range []struct {
		cl   *natsClient
		subj string
		body string
	}{
		{worker, protocol.APISubject(project, agent, protocol.OpCardGet), cardGet},
		{echo, tc.APIPrefix + ".CONSUMER.INFO." + tc.Stream + "." + tc.Consumer, ``},
		{echo, tc.APIPrefix + ".CONSUMER.MSG.NEXT." + tc.Stream + "." + tc.Consumer, `{"batch":1}`},
	} {
		require.NoError(t, m.cl.nc.PublishMsg(&nats.Msg{Subject: m.subj, Reply: evil, Data: []byte(m.body)}))
	}
	got := map[string]bool{}
	for len(got) < 3 {
		m, err := spy.NextMsg(time.Minute)
		require.NoError(t, err, "answers so far: %v", got)
		switch {
		case strings.Contains(string(m.Data), c.card.CardID) && strings.Contains(string(m.Data), `"ok":true`):
			got["ledger reply"] = true
		case strings.Contains(string(m.Data), "consumer_info_response"):
			got["jetstream reply"] = true
		case m.Header.Get(protocol.HeaderToolCallID) == c.id:
			got["pulled command"] = true
		}
	}
	_, err = witness.NextMsg(100 * time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "nothing reached the ledger's account")
	require.Empty(t, e.subjectEntries(t, evil))
	require.Equal(t, before, e.lastSeq(t), "nothing was written")
}

// registerEcho registers a tool whose target is echo in the test project.
func registerEcho(t *testing.T, e *authEnv) {
	t.Helper()
	_, err := e.l.RegisterToolYAML(ctxT(t), project, []byte("tool_name: echo\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo\nafter_execution: suspend\n"))
	require.NoError(t, err)
}

// spy connects a user of project's account that may subscribe to anything
// there (tests only: no grant gives that).
func (e *authEnv) spy(t *testing.T, project string) *nats.Conn {
	t.Helper()
	acc, err := e.srv.Keys().ProjectAccount(project)
	require.NoError(t, err)
	key, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, _ := key.PublicKey()
	seed, _ := key.Seed()
	uc := jwt.NewUserClaims(pub)
	uc.Sub.Allow.Add(">")
	tok, err := uc.Encode(acc)
	require.NoError(t, err)
	nc, err := e.srv.Dial(nats.UserJWTAndSeed(tok, string(seed)))
	require.NoError(t, err)
	return nc
}

// TestAuthRepliesStayInTheRequestersProject: a client of project B that
// addresses an answer (the ledger's, or a command pulled from its own
// consumer) to project A's wakeup or command subjects reaches only its own
// project's account: A's subscribers receive nothing.
func TestAuthRepliesStayInTheRequestersProject(t *testing.T) {
	e := newAuthEnv(t)
	const other = "proj-B"
	alice := e.client(t, auth.Grant{Role: auth.RoleWorker, Project: project, Agent: agent})
	aTool := e.client(t, auth.Grant{Role: auth.RoleTool, Project: project, Tool: "echo"})
	wakeA := protocol.WakeupSubject("v1", project, channel, agent)
	cmdA := protocol.ToolCommandSubject("v1", project, channel, "echo")
	wakeups, err := alice.nc.SubscribeSync(wakeA)
	require.NoError(t, err)
	cmds, err := aTool.nc.SubscribeSync(cmdA)
	require.NoError(t, err)
	require.NoError(t, alice.nc.Flush())
	require.NoError(t, aTool.nc.Flush())

	bWorker := e.client(t, auth.Grant{Role: auth.RoleWorker, Project: other})
	spyNC := e.spy(t, other)
	spy, err := spyNC.SubscribeSync("cg.>")
	require.NoError(t, err)
	require.NoError(t, spyNC.Flush())
	body := `{"project_id":"` + other + `","agent_turn_id":"t","tool_call_id":"k"}`
	for _, reply := range []string{wakeA, cmdA} {
		require.NoError(t, bWorker.nc.PublishMsg(&nats.Msg{Subject: protocol.APISubject(other, agent, protocol.OpCallGet), Reply: reply, Data: []byte(body)}))
	}
	for range 2 {
		m, err := spy.NextMsg(time.Minute)
		require.NoError(t, err, "the answers land in B's own account")
		require.Contains(t, string(m.Data), "unknown_call")
	}
	require.NoError(t, alice.nc.Flush())
	require.NoError(t, aTool.nc.Flush())
	_, err = wakeups.NextMsg(100 * time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "nothing reached project A's worker")
	_, err = cmds.NextMsg(100 * time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "nothing reached project A's tool")
}
