package ledger_test

import (
	"testing"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
	"github.com/stretchr/testify/require"
)

func TestConsumeIsRecordedOnceAndValidated(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-1", "call-1", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	req := protocol.ConsumeRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id}

	_, err := e.l.Consume(ctx, req)
	require.ErrorIs(t, err, protocol.ErrNotReported, "nothing to consume before the report")

	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	first, err := e.l.Consume(ctx, req)
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	require.Equal(t, out.Seq, first.ReportSeq)
	again, err := e.l.Consume(ctx, req)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.Seq, again.Seq)
	require.Len(t, e.subjectEntries(t, protocol.ConsumedSubject("v1", project, channel, c.turn, c.id)), 1)

	wrong := req
	wrong.AgentID = "someone-else"
	_, err = e.l.Consume(ctx, wrong)
	require.ErrorIs(t, err, protocol.ErrMismatch)
	unknown := req
	unknown.ToolCallID = "nope"
	_, err = e.l.Consume(ctx, unknown)
	require.ErrorIs(t, err, protocol.ErrUnknownCall)
	_, err = ledger.ConsumeJSON(e.l, ctx, []byte(`{"project_id":"p"}`))
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	le, _ := protocol.AsError(err)
	require.Len(t, le.Violations, 3)
}
