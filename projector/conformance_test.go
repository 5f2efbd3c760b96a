package projector_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// TestConformanceCommandsMakeNoCall: the commands of a conformance run
// (conformance.command), malformed or naming a call never dispatched, are
// placed in their turn's timeline and make no call; a copy of a real call's
// command leaves that call's dispatch as it was. The projector goes on.
func TestConformanceCommandsMakeNoCall(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "ann", Turn: "t1", ID: "c1", Epoch: 1, Tool: "echo"}
	d, err := e.L.Dispatch(ctx, c.Dispatch())
	require.NoError(t, err)
	subj := protocol.ToolCommandSubject("v1", "proj", "main", "echo")
	send := func(kase string, h map[string][]string, payload string) {
		t.Helper()
		_, err := e.L.ConformanceCommand(ctx, "ops", protocol.ConformanceCommandRequest{ProjectID: "proj", Run: "r1", Case: kase, Subject: subj, Headers: h, Payload: []byte(payload)})
		require.NoError(t, err)
	}
	send("missing-call-id", map[string][]string{protocol.HeaderAgentID: {"ann"}, protocol.HeaderAgentTurnID: {"t2"}, protocol.HeaderTurnEpoch: {"1"}},
		`{"tool_call_card_id":"cc-x","after_execution":"suspend"}`)
	send("unknown-card", map[string][]string{protocol.HeaderAgentID: {"ann"}, protocol.HeaderAgentTurnID: {"t3"}, protocol.HeaderTurnEpoch: {"1"}, protocol.HeaderToolCallID: {"k"}},
		`{"tool_call_card_id":"cc-missing","after_execution":"suspend"}`)
	send("copy", map[string][]string{protocol.HeaderAgentID: {"ann"}, protocol.HeaderAgentTurnID: {"t1"}, protocol.HeaderTurnEpoch: {"1"}, protocol.HeaderToolCallID: {"c1"}},
		`{"tool_call_card_id":"`+c.CardID()+`","tool_name":"echo","after_execution":"suspend"}`)

	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, newProjector(t, e, s, 16).CatchUp(ctx))
	q := projector.NewQueries(s)
	for _, turn := range []string{"t2", "t3"} {
		tl, err := q.Timeline("proj", turn, projector.AsOf{})
		require.NoError(t, err)
		require.Equal(t, []string{"command"}, kinds(tl.Items), "turn %s", turn)
	}
	_, _, err = q.CallState("proj", "t3", "k", projector.AsOf{})
	require.Error(t, err, "a conformance command makes no call")
	st, _, err := q.CallState("proj", "t1", "c1", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, d.CommandSeq, st.DispatchedSeq, "the copy leaves the dispatch as it was")
}
