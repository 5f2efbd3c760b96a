package e2e

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// TestAWorkerFindsResultsItsWakeupsMissed: against the binary, a worker
// that was not listening when its results were reported finds them with
// its own credential alone, over NATS (inbox.list, which serve's projector
// answers) and over HTTP, consumes them, and sees none left; another
// agent's pending results stay out of its reach.
func TestAWorkerFindsResultsItsWakeupsMissed(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	for _, id := range []string{"c-r1", "c-r2"} {
		out, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"x"}`, "--turn", "t-r", "--call-id", id)
		require.Equal(t, 0, code, out)
	}
	worker := s.issue(t, "--project", "demo", "--role", "worker", "--agent", "alice")
	nc := s.connectAs(t, worker)

	type page struct {
		AsOfSeq    uint64 `json:"as_of_seq"`
		LedgerSeq  uint64 `json:"ledger_seq"`
		NextCursor string `json:"next_cursor"`
		Items      []struct {
			ToolCallID  string `json:"tool_call_id"`
			AgentTurnID string `json:"agent_turn_id"`
			State       string `json:"state"`
		} `json:"items"`
	}
	// As docs/protocol.md says: a page whose views lag the ledger
	// (as_of_seq < ledger_seq) is asked for again.
	list := func(body map[string]any) page {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		var p page
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			m, err := nc.Request("cgledger.v1.demo.alice.inbox.list", b, 10*time.Second)
			if !assert.NoError(c, err) {
				return
			}
			var r reply
			if !assert.NoError(c, json.Unmarshal(m.Data, &r)) || !assert.True(c, r.OK, "%+v", r.Error) {
				return
			}
			p = page{}
			if assert.NoError(c, json.Unmarshal(r.Result, &p)) {
				assert.NotZero(c, p.LedgerSeq)
				assert.GreaterOrEqual(c, p.AsOfSeq, p.LedgerSeq, "the views lag the ledger")
			}
		}, time.Minute, 50*time.Millisecond)
		return p
	}
	p := list(map[string]any{"project_id": "demo", "agent_id": "alice", "limit": 1})
	require.Len(t, p.Items, 1)
	require.Equal(t, "c-r1", p.Items[0].ToolCallID)
	require.Equal(t, "pending", p.Items[0].State)
	require.NotEmpty(t, p.NextCursor)
	p = list(map[string]any{"project_id": "demo", "agent_id": "alice", "limit": 1, "cursor": p.NextCursor})
	require.Len(t, p.Items, 1)
	require.Equal(t, "c-r2", p.Items[0].ToolCallID)

	resp := httpAs(t, worker, "GET", s.httpURL()+"/v1/projects/demo/agents/alice/inbox?state=pending", "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var hp page
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&hp))
	require.Len(t, hp.Items, 2)
	require.Equal(t, http.StatusForbidden, httpAs(t, worker, "GET", s.httpURL()+"/v1/projects/demo/agents/bob/inbox?state=pending", "").StatusCode)

	for _, id := range []string{"c-r1", "c-r2"} {
		r := req(t, nc, "cgledger.v1.demo.alice.inbox.consume", nil, map[string]any{"project_id": "demo", "agent_id": "alice", "agent_turn_id": "t-r", "tool_call_id": id})
		require.True(t, r.OK, "%+v", r.Error)
	}
	require.Empty(t, list(map[string]any{"project_id": "demo", "agent_id": "alice"}).Items)
}
