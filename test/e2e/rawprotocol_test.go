package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// This file uses nothing from the project: only a NATS client, HTTP and
// JSON, following docs/protocol.md as a service written in another
// language would.

type reply struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code       string `json:"code"`
		Violations []struct {
			Field string `json:"field"`
			Code  string `json:"code"`
		} `json:"violations"`
	} `json:"error"`
}

func req(t *testing.T, nc *nats.Conn, subject string, h nats.Header, body any) reply {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	m, err := nc.RequestMsg(&nats.Msg{Subject: subject, Header: h, Data: b}, 10*time.Second)
	require.NoError(t, err)
	var r reply
	require.NoError(t, json.Unmarshal(m.Data, &r), string(m.Data))
	return r
}

// credential is what `cgledger creds issue --json` prints.
type credential = servetest.Credential

// issue runs `cgledger creds issue` against s's data directory.
func (s *server) issue(t *testing.T, args ...string) credential {
	t.Helper()
	return s.Issue(t, args...)
}

// connectAs connects to s with a credential, as any NATS client would: the
// .creds file and the inbox prefix its permissions allow.
func (s *server) connectAs(t *testing.T, c credential) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.natsURL(), nats.UserCredentials(c.Path), nats.CustomInboxPrefix(c.InboxPrefix))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// httpAs sends an HTTP request with a credential's JWT as bearer token.
func httpAs(t *testing.T, c credential, method, url, body string) *http.Response {
	t.Helper()
	rq, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if c.JWT != "" {
		rq.Header.Set("Authorization", "Bearer "+c.JWT)
	}
	resp, err := http.DefaultClient.Do(rq)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestRawWireProtocolToolService(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	admin := s.issue(t, "--project", "p1", "--role", "admin")
	auditor := s.issue(t, "--project", "p1", "--role", "auditor")
	worker := s.issue(t, "--project", "p1", "--role", "worker", "--agent", "a1", "--target", "w1")
	tool := s.issue(t, "--project", "p1", "--role", "tool", "--tool", "rawsvc")
	wc := s.connectAs(t, worker)
	tc := s.connectAs(t, tool)

	// Register the tool over HTTP (YAML body) as the project's admin.
	def := "tool_name: upper\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.rawsvc.upper\nafter_execution: suspend\n"
	resp := httpAs(t, admin, "POST", s.httpURL()+"/projects/p1/tools", def)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.True(t, req(t, wc, "cgledger.v1.p1.a1.roster.set", nil, map[string]string{"project_id": "p1", "agent_id": "a1", "worker_target": "w1"}).OK)

	// The tool service: pulls the durable consumer the ledger keeps for its
	// tool (the only JetStream API its credential reaches).
	cons := req(t, tc, "cgledger.v1.p1.rawsvc.tool.consumer", nil, map[string]any{})
	require.True(t, cons.OK, "%+v", cons.Error)
	var ci struct {
		Stream    string `json:"stream"`
		Consumer  string `json:"consumer"`
		APIPrefix string `json:"api_prefix"`
	}
	require.NoError(t, json.Unmarshal(cons.Result, &ci))
	served := make(chan string, 1)
	handle := func(cmd *nats.Msg) {
		parts := strings.Split(cmd.Subject, ".")
		project, channel := parts[2], parts[3]
		var payload struct {
			ToolCallCardID string `json:"tool_call_card_id"`
			ToolName       string `json:"tool_name"`
			AfterExecution string `json:"after_execution"`
		}
		if json.Unmarshal(cmd.Data, &payload) != nil {
			return
		}
		r := req(t, tc, "cgledger.v1."+project+".rawsvc.card.get", nil, map[string]any{"project_id": project, "card_ids": []string{payload.ToolCallCardID}})
		var got struct {
			Cards []struct {
				Card struct {
					AgentTurnID string `json:"agent_turn_id"`
					ToolCallID  string `json:"tool_call_id"`
					Content     struct {
						Arguments map[string]string `json:"arguments"`
					} `json:"content"`
					Metadata map[string]string `json:"metadata"`
				} `json:"card"`
			} `json:"cards"`
		}
		if !r.OK || json.Unmarshal(r.Result, &got) != nil || len(got.Cards) != 1 {
			return
		}
		call := got.Cards[0].Card
		result := map[string]any{
			"card_id": "res-" + call.ToolCallID, "project_id": project, "type": "tool.result",
			"author_id": "svc.upper", "function_name": payload.ToolName,
			"agent_turn_id": call.AgentTurnID, "tool_call_id": call.ToolCallID,
			"content":  map[string]any{"status": "success", "result": map[string]string{"text": strings.ToUpper(call.Content.Arguments["text"])}},
			"metadata": call.Metadata,
		}
		if !req(t, tc, "cgledger.v1."+project+".rawsvc.card.put", nil, result).OK {
			return
		}
		h := nats.Header{}
		for _, k := range []string{"CG-Agent-Id", "CG-Agent-Turn-Id", "CG-Turn-Epoch", "CG-Tool-Call-Id"} {
			h.Set(k, cmd.Header.Get(k))
		}
		h.Set("CG-Project-Id", project)
		h.Set("CG-Channel-Id", channel)
		h.Set("CG-Source-Id", "svc.upper")
		h.Set("CG-Source-Function", payload.ToolName)
		h.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01")
		rep := req(t, tc, "cgledger.v1."+project+".rawsvc.report", h, map[string]string{"status": "success", "after_execution": payload.AfterExecution, "tool_result_card_id": "res-" + call.ToolCallID})
		if rep.OK {
			_ = cmd.Ack()
			served <- call.ToolCallID
		}
	}
	// A JetStream pull, spelled out as the JetStream wire API under the
	// prefix tool.consumer names: <api_prefix>.CONSUMER.MSG.NEXT.<stream>.<consumer>
	// with the reply inbox.
	pullInbox := tool.InboxPrefix + ".pull"
	msgs, err := tc.SubscribeSync(pullInbox)
	require.NoError(t, err)
	go func() {
		for {
			if err := tc.PublishRequest(ci.APIPrefix+".CONSUMER.MSG.NEXT."+ci.Stream+"."+ci.Consumer, pullInbox, []byte(`{"batch":1,"expires":1000000000}`)); err != nil {
				return
			}
			m, err := msgs.NextMsg(5 * time.Second)
			if err != nil {
				if tc.IsClosed() {
					return
				}
				continue
			}
			if len(m.Data) > 0 && strings.HasPrefix(m.Reply, "$JS.ACK.") {
				handle(m)
				return
			}
		}
	}()
	wake, err := wc.SubscribeSync("cg.v1.p1.c1.cmd.agent.w1.wakeup")
	require.NoError(t, err)

	// The worker: dispatch through the ledger API.
	h := nats.Header{}
	h.Set("CG-Agent-Id", "a1")
	h.Set("CG-Agent-Turn-Id", "t1")
	h.Set("CG-Turn-Epoch", "1")
	h.Set("CG-Tool-Call-Id", "k1")
	d := req(t, wc, "cgledger.v1.p1.a1.dispatch", h, map[string]any{
		"subject": "cg.v1.p1.c1.cmd.tool.rawsvc.upper",
		"card": map[string]any{"card_id": "cc-k1", "project_id": "p1", "type": "tool.call", "author_id": "a1",
			"agent_turn_id": "t1", "tool_call_id": "k1",
			"content":  map[string]any{"tool_name": "upper", "arguments": map[string]string{"text": "shout"}},
			"metadata": map[string]string{"trace_id": "tr", "parent_step_id": "ps", "step_id": "s"}},
		"payload": map[string]string{"tool_call_card_id": "cc-k1", "tool_name": "upper", "after_execution": "suspend"},
	})
	require.True(t, d.OK, "%+v", d.Error)
	select {
	case id := <-served:
		require.Equal(t, "k1", id)
	case <-time.After(30 * time.Second):
		t.Fatal("the tool service never answered")
	}
	w, err := wake.NextMsg(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "k1", w.Header.Get("CG-Tool-Call-Id"))

	// The result is in the agent's Inbox (audit API) and the call is done.
	require.Eventually(t, func() bool {
		resp := httpAs(t, auditor, "GET", s.httpURL()+"/v1/projects/p1/agents/a1/inbox?state=pending", "")
		var in struct {
			Items []struct {
				ToolCallID string `json:"tool_call_id"`
				Status     string `json:"status"`
			} `json:"items"`
		}
		return json.NewDecoder(resp.Body).Decode(&in) == nil && len(in.Items) == 1 && in.Items[0].Status == "success"
	}, 30*time.Second, 50*time.Millisecond)
	c := req(t, wc, "cgledger.v1.p1.a1.call.get", nil, map[string]string{"project_id": "p1", "agent_turn_id": "t1", "tool_call_id": "k1"})
	require.True(t, c.OK)
	require.Contains(t, string(c.Result), `"state":"woken"`)
	require.True(t, req(t, wc, "cgledger.v1.p1.a1.inbox.consume", nil, map[string]string{"project_id": "p1", "agent_id": "a1", "agent_turn_id": "t1", "tool_call_id": "k1"}).OK)

	// A malformed report lists every violation.
	bad := req(t, tc, "cgledger.v1.p1.rawsvc.report", nats.Header{"CG-Turn-Epoch": {"x"}}, map[string]any{"status": "done", "result": 1})
	require.False(t, bad.OK)
	require.Equal(t, "bad_request", bad.Error.Code)
	require.GreaterOrEqual(t, len(bad.Error.Violations), 8)
	var body bytes.Buffer
	_ = json.NewEncoder(&body).Encode(bad.Error)
	require.Contains(t, body.String(), "payload.result")
}
