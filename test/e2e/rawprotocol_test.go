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

func TestRawWireProtocolToolService(t *testing.T) {
	s := startServer(t, t.TempDir(), freePort(t), freePort(t))
	nc, err := nats.Connect(s.natsURL())
	require.NoError(t, err)
	defer nc.Close()

	// Register the tool over HTTP (YAML body).
	def := "tool_name: upper\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.rawsvc.upper\nafter_execution: suspend\n"
	resp, err := http.Post(s.httpURL()+"/projects/p1/tools", "application/yaml", strings.NewReader(def))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.True(t, req(t, nc, "cgledger.v1.roster.set", nil, map[string]string{"project_id": "p1", "agent_id": "a1", "worker_target": "w1"}).OK)

	// The tool service: a queue subscription on the tool's subject.
	served := make(chan string, 1)
	sub, err := nc.QueueSubscribe("cg.v1.p1.*.cmd.tool.rawsvc.>", "rawsvc", func(cmd *nats.Msg) {
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
		r := req(t, nc, "cgledger.v1.card.get", nil, map[string]any{"project_id": project, "card_ids": []string{payload.ToolCallCardID}})
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
		if !req(t, nc, "cgledger.v1.card.put", nil, result).OK {
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
		rep := req(t, nc, "cgledger.v1.report", h, map[string]string{"status": "success", "after_execution": payload.AfterExecution, "tool_result_card_id": "res-" + call.ToolCallID})
		if rep.OK {
			served <- call.ToolCallID
		}
	})
	require.NoError(t, err)
	defer sub.Unsubscribe()
	wake, err := nc.SubscribeSync("cg.v1.p1.c1.cmd.agent.w1.wakeup")
	require.NoError(t, err)

	// The worker: dispatch through the ledger API.
	h := nats.Header{}
	h.Set("CG-Agent-Id", "a1")
	h.Set("CG-Agent-Turn-Id", "t1")
	h.Set("CG-Turn-Epoch", "1")
	h.Set("CG-Tool-Call-Id", "k1")
	d := req(t, nc, "cgledger.v1.dispatch", h, map[string]any{
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
		resp, err := http.Get(s.httpURL() + "/v1/projects/p1/agents/a1/inbox?state=pending")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var in struct {
			Items []struct {
				ToolCallID string `json:"tool_call_id"`
				Status     string `json:"status"`
			} `json:"items"`
		}
		return json.NewDecoder(resp.Body).Decode(&in) == nil && len(in.Items) == 1 && in.Items[0].Status == "success"
	}, 30*time.Second, 50*time.Millisecond)
	c := req(t, nc, "cgledger.v1.call.get", nil, map[string]string{"project_id": "p1", "agent_turn_id": "t1", "tool_call_id": "k1"})
	require.True(t, c.OK)
	require.Contains(t, string(c.Result), `"state":"woken"`)
	require.True(t, req(t, nc, "cgledger.v1.inbox.consume", nil, map[string]string{"project_id": "p1", "agent_id": "a1", "agent_turn_id": "t1", "tool_call_id": "k1"}).OK)

	// A malformed report lists every violation.
	bad := req(t, nc, "cgledger.v1.report", nats.Header{"CG-Turn-Epoch": {"x"}}, map[string]any{"status": "done", "result": 1})
	require.False(t, bad.OK)
	require.Equal(t, "bad_request", bad.Error.Code)
	require.GreaterOrEqual(t, len(bad.Error.Violations), 8)
	var body bytes.Buffer
	_ = json.NewEncoder(&body).Encode(bad.Error)
	require.Contains(t, body.String(), "payload.result")
}
