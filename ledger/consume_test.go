package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
)

func TestConsumeIsRecordedOnceAndValidated(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-1", "call-1", 1)
	rc := e.dispatchAndResult(t, c, ledger.StatusSuccess)
	req := ledger.ConsumeRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id}

	_, err := e.l.Consume(ctx, req)
	require.ErrorIs(t, err, ledger.ErrNotReported, "nothing to consume before the report")

	out, err := e.l.Report(ctx, c.reportReq(ledger.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	first, err := e.l.Consume(ctx, req)
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	require.Equal(t, out.Seq, first.ReportSeq)
	again, err := e.l.Consume(ctx, req)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.Seq, again.Seq)
	require.Len(t, e.subjectEntries(t, ledger.ConsumedSubject("v1", project, channel, c.turn, c.id)), 1)

	wrong := req
	wrong.AgentID = "someone-else"
	_, err = e.l.Consume(ctx, wrong)
	require.ErrorIs(t, err, ledger.ErrMismatch)
	unknown := req
	unknown.ToolCallID = "nope"
	_, err = e.l.Consume(ctx, unknown)
	require.ErrorIs(t, err, ledger.ErrUnknownCall)
	_, err = e.l.ConsumeJSON(ctx, []byte(`{"project_id":"p"}`))
	require.ErrorIs(t, err, ledger.ErrBadRequest)
	le, _ := ledger.AsError(err)
	require.Len(t, le.Violations, 3)
}
