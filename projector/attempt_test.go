package projector_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// TestAttemptsAndOutcomeUnknownInTheViews: attempt entries are applied (not
// unrecognized), sit in the call's timeline, and the call state shows the
// latest attempt and how an open attempt was resolved.
func TestAttemptsAndOutcomeUnknownInTheViews(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-1", ID: "call-1", Epoch: 1, Tool: "pay"}
	_, err := e.L.Dispatch(ctx, c.Dispatch())
	require.NoError(t, err)
	res, err := e.L.StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, ExecutorID: "exec-a"})
	require.NoError(t, err)
	require.True(t, res.Started)
	_, err = e.L.PutCard(ctx, c.ResultCard(protocol.StatusFailed, `{}`))
	require.NoError(t, err)
	rep := c.Report(protocol.StatusFailed)
	rep.Payload.AttemptOutcome = protocol.AttemptOutcomeUnknown
	_, err = e.L.Report(ctx, rep)
	require.NoError(t, err)
	rec, err := e.L.GetCall(ctx, c.Project, c.Turn, c.ID)
	require.NoError(t, err)
	require.Equal(t, protocol.AttemptOutcomeUnknown, rec.Outcome, "call.get shows the outcome")

	s := openStore(t, filepath.Join(t.TempDir(), "v"))
	defer s.Close()
	require.NoError(t, newProjector(t, e, s, 100).CatchUp(ctx))
	q := projector.NewQueries(s)
	st, _, err := q.CallState(c.Project, c.Turn, c.ID, projector.AsOf{})
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Attempt)
	require.Equal(t, res.Seq, st.AttemptSeq)
	require.Equal(t, protocol.AttemptOutcomeUnknown, st.Outcome)
	require.Equal(t, protocol.StatusFailed, st.Status)
	tl, err := q.Timeline(c.Project, c.Turn, projector.AsOf{})
	require.NoError(t, err)
	var kinds []string
	for _, it := range tl.Items {
		kinds = append(kinds, it.Kind)
	}
	require.Contains(t, kinds, string(protocol.KindAttempt))
	un, err := q.Unrecognized(projector.AsOf{}, "", 100)
	require.NoError(t, err)
	require.Empty(t, un.Items)
}
