package projector_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// TestInboxListRefusalsNobodyHearsAreRecorded: without credentials, an
// inbox.list whose reply subject is not an inbox is not answered and is
// recorded as a bad_request rejection on "reply", exactly as the ledger's
// API server records card.get's (docs/protocol.md, "whatever the
// operation"); a refused inbox.list with no reply subject is recorded as
// the API server records a refused read it cannot answer.
func TestInboxListRefusalsNobodyHearsAreRecorded(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	papi, err := p.ServeAPI(ctx, e.NC, e.L, projector.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(func() {
		papi.Stop()
		stop()
		require.NoError(t, <-done)
		require.NoError(t, s.Close())
	})

	nc := e.Srv.Connect(t)
	stray, err := nc.SubscribeSync("myreply.>")
	require.NoError(t, err)
	body := []byte(`{"project_id":"p1","agent_id":"a1","card_ids":["x"]}`)
	for _, op := range []string{protocol.OpCardGet, protocol.OpInboxList} {
		require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: protocol.APISubject("p1", "a1", op), Reply: "myreply.1", Data: body}))
	}
	// Another agent's listing, with nobody to tell: forbidden, recorded.
	require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: protocol.APISubject("p1", "a1", protocol.OpInboxList), Data: []byte(`{"project_id":"p1","agent_id":"a2"}`)}))

	// Three entries, then read once: a consumer per poll would run into
	// the stream's consumer limit.
	require.Eventually(t, func() bool { return rejectionCount(t, e.JS) >= 3 }, time.Minute, 20*time.Millisecond)
	byOp := map[string][]rejection{}
	for _, r := range rejections(t, e.JS) {
		byOp[r.Op] = append(byOp[r.Op], r)
	}
	require.Len(t, byOp[protocol.OpCardGet], 1, "%+v", byOp)
	require.Len(t, byOp[protocol.OpInboxList], 2, "%+v", byOp)

	want := byOp[protocol.OpCardGet][0]
	require.Equal(t, protocol.CodeBadRequest, want.Code)
	require.Equal(t, []string{"reply"}, fields(want.Violations))
	var got, forbidden rejection
	for _, r := range byOp[protocol.OpInboxList] {
		if r.Code == protocol.CodeForbidden {
			forbidden = r
		} else {
			got = r
		}
	}
	// The same entry but for the operation's name.
	got.Op, got.Message = want.Op, strings.Replace(got.Message, protocol.OpInboxList, protocol.OpCardGet, 1)
	require.Equal(t, want, got)

	require.Equal(t, protocol.CodeForbidden, forbidden.Code, "%+v", byOp[protocol.OpInboxList])
	require.Equal(t, []string{"body.agent_id"}, fields(forbidden.Violations))
	require.Equal(t, "cg.v1._._.ledger.rejection.forbidden", forbidden.subject)
	require.Equal(t, "p1", forbidden.project)

	_, err = stray.NextMsg(100 * time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "answered on a reply subject that is not an inbox")
}

// rejection is a rejection entry with where it was filed.
type rejection struct {
	protocol.RejectionEntry
	subject, project string
}

const rejectionFilter = "cg.v1.*.*.ledger.rejection.>"

// rejectionCount is the number of rejection entries in the ledger stream.
func rejectionCount(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	st, err := js.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(rejectionFilter))
	require.NoError(t, err)
	var total uint64
	for _, n := range info.State.Subjects {
		total += n
	}
	return total
}

// rejections reads every rejection entry of the ledger stream.
func rejections(t *testing.T, js jetstream.JetStream) []rejection {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	total := rejectionCount(t, js)
	st, err := js.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{rejectionFilter}})
	require.NoError(t, err)
	var out []rejection
	for uint64(len(out)) < total {
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		var r rejection
		require.NoError(t, json.Unmarshal(m.Data(), &r.RejectionEntry))
		r.subject, r.project = m.Subject(), m.Headers().Get(protocol.HeaderProjectID)
		out = append(out, r)
	}
	return out
}
