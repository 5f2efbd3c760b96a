package ledger_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
)

// populate writes a small but varied ledger: roster, calls, reports, a
// duplicate and a rejection.
func populate(t *testing.T, e *env, calls int) {
	t.Helper()
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, ledger.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w"})
	require.NoError(t, err)
	for i := range calls {
		c := newCall("turn-x", "call-"+string(rune('a'+i)), 1)
		rc := e.dispatchAndResult(t, c, ledger.StatusSuccess)
		_, err := e.l.Report(ctx, c.reportReq(ledger.StatusSuccess, rc.CardID))
		require.NoError(t, err)
	}
	c := newCall("turn-x", "call-a", 1)
	_, err = e.l.Report(ctx, c.reportReq(ledger.StatusSuccess, c.resultCard(ledger.StatusSuccess).CardID))
	require.NoError(t, err)
	stale := c
	stale.epoch = 9
	_, err = e.l.Report(ctx, stale.reportReq(ledger.StatusSuccess, c.resultCard(ledger.StatusSuccess).CardID))
	require.ErrorIs(t, err, ledger.ErrStaleEpoch)
}

func TestExportVerifiesAndNamesTheEditedEntry(t *testing.T) {
	e := newEnv(t)
	populate(t, e, 3)
	var buf bytes.Buffer
	tr, err := e.l.Export(ctxT(t), &buf, 0)
	require.NoError(t, err)
	require.NotZero(t, tr.Count)

	rep, err := ledger.VerifyExport(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.Equal(t, tr.Head, rep.Head)
	require.Equal(t, tr.Count, rep.Count)

	// Edit one entry's data (a report's status) and re-encode that line only.
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	target := 0
	for i, l := range lines {
		if strings.Contains(l, `"CG-Entry-Kind":["report"]`) {
			target = i
			break
		}
	}
	require.NotZero(t, target)
	var ee ledger.ExportEntry
	require.NoError(t, json.Unmarshal([]byte(lines[target]), &ee))
	ee.Data = bytes.Replace(ee.Data, []byte(`"status":"success"`), []byte(`"status":"failed"`), 1)
	edited, err := json.Marshal(ee)
	require.NoError(t, err)
	lines[target] = string(edited)
	rep, err = ledger.VerifyExport(strings.NewReader(strings.Join(lines, "\n")))
	require.NoError(t, err)
	require.False(t, rep.OK)
	require.Equal(t, ee.Seq, rep.FirstBadSeq)

	// A header change is caught too, and so is a truncated file.
	orig := strings.Split(strings.TrimSpace(buf.String()), "\n")
	headerEdit := append([]string(nil), orig...)
	require.NoError(t, json.Unmarshal([]byte(orig[target-1]), &ee))
	ee.Headers[ledger.HeaderTime] = []string{"2001-01-01T00:00:00Z"}
	edited, err = json.Marshal(ee)
	require.NoError(t, err)
	headerEdit[target-1] = string(edited)
	rep, err = ledger.VerifyExport(strings.NewReader(strings.Join(headerEdit, "\n")))
	require.NoError(t, err)
	require.Equal(t, ee.Seq, rep.FirstBadSeq)

	rep, err = ledger.VerifyExport(strings.NewReader(strings.Join(orig[:len(orig)-1], "\n")))
	require.NoError(t, err)
	require.False(t, rep.OK)
	require.Contains(t, rep.Reason, "truncated")
}

func TestExportFromSequenceCarriesPrevLink(t *testing.T) {
	e := newEnv(t)
	populate(t, e, 2)
	var full, tail bytes.Buffer
	_, err := e.l.Export(ctxT(t), &full, 0)
	require.NoError(t, err)
	tr, err := e.l.Export(ctxT(t), &tail, 5)
	require.NoError(t, err)
	rep, err := ledger.VerifyExport(&tail)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.EqualValues(t, 5, rep.FromSeq)
	// The partial export ends on the same head as the full one.
	fullRep, err := ledger.VerifyExport(&full)
	require.NoError(t, err)
	require.Equal(t, fullRep.Head, tr.Head)
	require.Equal(t, fullRep.LastSeq, rep.LastSeq)
}

func TestChainCoversCanonicalHeadersOnly(t *testing.T) {
	h1 := nats.Header{"CG-Agent-Id": {"a"}, "Nats-Msg-Id": {"x"}}
	h2 := nats.Header{"cg-agent-id": {"a"}, "Nats-Msg-Id": {"y"}}
	l1 := ledger.NextLink(ledger.Genesis, 1, "s", h1, []byte("d"))
	require.Equal(t, l1, ledger.NextLink(ledger.Genesis, 1, "s", h2, []byte("d")), "header case and Nats-* headers do not matter")
	require.NotEqual(t, l1, ledger.NextLink(ledger.Genesis, 2, "s", h1, []byte("d")))
	require.NotEqual(t, l1, ledger.NextLink(ledger.Genesis, 1, "t", h1, []byte("d")))
	require.NotEqual(t, l1, ledger.NextLink(ledger.Genesis, 1, "s", nats.Header{"CG-Agent-Id": {"b"}}, []byte("d")))
	require.NotEqual(t, l1, ledger.NextLink(ledger.Genesis, 1, "s", h1, []byte("e")))
	require.NotEqual(t, l1, ledger.NextLink(l1, 1, "s", h1, []byte("d")))
}
