package projector_test

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// TestResolutionInTheViews: an operator's resolution of an outcome_unknown
// call is applied (not unrecognized, the projector does not stop on it):
// the call state shows its effect and entry beside the report it leaves as
// it was, and the call's story holds the entry.
func TestResolutionInTheViews(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-1", ID: "call-1", Epoch: 1, Tool: "pay"}
	_, err := e.L.Dispatch(ctx, c.Dispatch())
	require.NoError(t, err)
	_, err = e.L.StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, ExecutorID: "exec-a"})
	require.NoError(t, err)
	card := c.ResultCard(protocol.StatusFailed, `null`)
	card.Content = json.RawMessage(`{"status":"failed","result":null,"error":{"code":"internal_error","message":"lost","detail":{"taxonomy_code":"S-TOOL-OUTCOME-UNKNOWN"}}}`)
	_, err = e.L.PutCard(ctx, card)
	require.NoError(t, err)
	rep := c.Report(protocol.StatusFailed)
	rep.Payload.AttemptOutcome = protocol.AttemptOutcomeUnknown
	_, err = e.L.Report(ctx, rep)
	require.NoError(t, err)
	res, err := e.L.Resolve(ctx, "ops", protocol.ResolveRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, Effect: protocol.EffectNotApplied, Reason: "no transfer at the bank"})
	require.NoError(t, err)

	s := openStore(t, filepath.Join(t.TempDir(), "v"))
	defer s.Close()
	require.NoError(t, newProjector(t, e, s, 100).CatchUp(ctx))
	q := projector.NewQueries(s)
	st, _, err := q.CallState(c.Project, c.Turn, c.ID, projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, protocol.EffectNotApplied, st.Resolution)
	require.Equal(t, res.Seq, st.ResolutionSeq)
	require.Equal(t, protocol.StatusFailed, st.Status, "the report is as it was")
	require.Equal(t, protocol.AttemptOutcomeUnknown, st.Outcome)
	story, err := q.CallStory(c.Project, c.ID, c.Turn, projector.AsOf{})
	require.NoError(t, err)
	var kinds []string
	for _, it := range story.Items {
		kinds = append(kinds, it.Kind)
	}
	require.Contains(t, kinds, string(protocol.KindResolution))
	un, err := q.Unrecognized(projector.AsOf{}, "", 100)
	require.NoError(t, err)
	require.Empty(t, un.Items)
}

// TestRedriveInTheViews: an operator's redrive of a failed call is
// applied (not unrecognized): the call state names the derived call and
// the entry beside the report it leaves as it was, the call's story holds
// the entry, and the derived call has its own state and story.
func TestRedriveInTheViews(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-1", ID: "call-1", Epoch: 1, Tool: "deploy"}
	e.Complete(t, c, protocol.StatusFailed, `null`)
	res, err := e.L.Redrive(ctx, "ops", protocol.RedriveRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, Reason: "the host is back"})
	require.NoError(t, err)

	s := openStore(t, filepath.Join(t.TempDir(), "v"))
	defer s.Close()
	require.NoError(t, newProjector(t, e, s, 100).CatchUp(ctx))
	q := projector.NewQueries(s)
	st, _, err := q.CallState(c.Project, c.Turn, c.ID, projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, "call-1~r1", st.RedriveCallID)
	require.Equal(t, res.Seq, st.RedriveSeq)
	require.Equal(t, protocol.StatusFailed, st.Status, "the report is as it was")
	story, err := q.CallStory(c.Project, c.ID, c.Turn, projector.AsOf{})
	require.NoError(t, err)
	var kinds []string
	for _, it := range story.Items {
		kinds = append(kinds, it.Kind)
	}
	require.Contains(t, kinds, string(protocol.KindRedrive))
	derived, _, err := q.CallState(c.Project, c.Turn, res.RedriveCallID, projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, res.Dispatch.CommandSeq, derived.DispatchedSeq)
	un, err := q.Unrecognized(projector.AsOf{}, "", 100)
	require.NoError(t, err)
	require.Empty(t, un.Items)
}
