package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

const echoYAML = `
tool_name: echo
parameters: {type: object}
target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo
after_execution: suspend
`

// TestDispatchPinsTheDefinitionInForce: the call record names the
// definition entry and version in force at dispatch, which stays readable by
// its sequence (GetToolAt) after a new version is registered; a repeated
// dispatch keeps the first pin. A definition registered before version
// existed registers again unchanged.
func TestDispatchPinsTheDefinitionInForce(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	old, err := e.l.RegisterToolYAML(ctx, project, []byte(echoYAML))
	require.NoError(t, err)
	again, err := e.l.RegisterToolYAML(ctx, project, []byte(echoYAML))
	require.NoError(t, err)
	require.True(t, again.Unchanged, "a definition without the new fields keeps its bytes")

	v1, err := e.l.RegisterToolYAML(ctx, project, []byte(echoYAML+"version: \"1.0.0\"\nowner: \"@team-a\"\n"))
	require.NoError(t, err)
	require.NotEqual(t, old.Seq, v1.Seq)

	c := newCall("turn-pin", "call-pin", 1)
	res, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	require.Equal(t, v1.Seq, res.ToolDefSeq)
	require.Equal(t, "1.0.0", res.ToolVersion)
	rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, v1.Seq, rec.ToolDefSeq)
	require.Equal(t, "1.0.0", rec.ToolVersion)

	v2, err := e.l.RegisterToolYAML(ctx, project, []byte(echoYAML+"version: \"2.0.0\"\n"))
	require.NoError(t, err)
	dup, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	rec, err = e.l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, v1.Seq, rec.ToolDefSeq, "a repeated dispatch keeps the first pin")

	in := e.l.ReadExecutionInputs(ctx, protocol.ExecutionQuery{Project: project, Channel: channel, AgentTurnID: c.turn,
		ToolCallID: c.id, ToolCallCardID: c.card.CardID, ToolName: "echo", Fresh: true})
	require.NoError(t, in.ToolErr)
	require.Equal(t, v1.Seq, in.Tool.Seq, "an executor reads the pinned definition")
	require.Equal(t, "1.0.0", in.Tool.Definition.Version)
	require.Equal(t, "@team-a", in.Tool.Definition.Owner)

	cur, err := e.l.GetTool(ctx, project, "echo")
	require.NoError(t, err)
	require.Equal(t, v2.Seq, cur.Seq)
	_, err = e.l.GetToolAt(ctx, project, "echo", res.CommandSeq)
	require.ErrorIs(t, err, protocol.ErrNotFound, "a sequence holding no definition of the tool")
	_, err = e.l.GetToolAt(ctx, project, "web_search", v1.Seq)
	require.ErrorIs(t, err, protocol.ErrNotFound, "the definition of another tool")
}
