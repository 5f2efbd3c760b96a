package projector_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// TestPauseViews: a call held by a pause of its tool is in state paused
// (listed from its held time, in the calls index's state dimension) until
// the resume's command moves it to dispatched; the tool's pause state is
// read as of any sequence; a rebuild gives the same digest.
func TestPauseViews(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	_, err := e.L.RegisterToolYAML(ctx, "proj", []byte("tool_name: deploy\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.deploy\nafter_execution: suspend\n"))
	require.NoError(t, err)
	pause := protocol.ToolPauseRequest{ProjectID: "proj", ToolName: "deploy", Reason: "maintenance"}
	p, err := e.L.PauseTool(ctx, "ops", pause)
	require.NoError(t, err)
	c1 := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "c1", Epoch: 1, Tool: "deploy"}
	res, err := e.L.Dispatch(ctx, c1.Dispatch())
	require.NoError(t, err)
	require.True(t, res.Paused)
	r, err := e.L.ResumeTool(ctx, "ops", pause)
	require.NoError(t, err)
	require.Equal(t, 1, r.Released)

	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	pr := newProjector(t, e, s, 3)
	require.NoError(t, pr.CatchUp(ctx))
	q := projector.NewQueries(s)
	whilePaused := projector.AsOf{Seq: r.Seq - 1}

	st, _, err := q.CallState("proj", "t1", "c1", whilePaused)
	require.NoError(t, err)
	require.Equal(t, projector.StatePaused, st.State)
	require.NotZero(t, st.PausedSeq)
	require.Zero(t, st.DispatchedSeq, "no command while paused")
	page, err := q.Calls("proj", projector.CallFilter{State: projector.StatePaused}, whilePaused, "", 10)
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	require.Equal(t, "c1", page.Items[0].ToolCallID)
	th, err := q.Tool("proj", "deploy", whilePaused)
	require.NoError(t, err)
	require.Equal(t, &projector.ToolPauseState{Seq: p.Seq, Paused: true, Actor: "ops", Reason: "maintenance"}, th.Pause)

	st, _, err = q.CallState("proj", "t1", "c1", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, projector.StateDispatched, st.State, "released by the resume")
	th, err = q.Tool("proj", "deploy", projector.AsOf{})
	require.NoError(t, err)
	require.False(t, th.Pause.Paused)
	require.Equal(t, r.Seq, th.Pause.Seq)

	want := digest(t, s)
	require.NoError(t, pr.Rebuild(ctx))
	require.Equal(t, want, digest(t, s), "rebuild")
}
