package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

func TestLedgerSurvivesRestartOnSameStore(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-r", "call-r", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	e.srv.Restart(t)
	waitConnected(t, e.nc)
	// Re-open as a restarted process would: provisioning finds everything in place.
	l2, err := ledger.Open(ctx, e.nc, ledger.Config{})
	require.NoError(t, err)
	card, err := l2.GetCard(ctx, project, rc.CardID)
	require.NoError(t, err)
	require.Equal(t, rc.CardID, card.Card.CardID)
	dup, err := l2.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, out.Seq, dup.Seq)
}
