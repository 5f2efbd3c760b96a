package ledger_test

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// sameEntry is a stream entry as compared across two ledgers: what
// differs legitimately (the time an entry was written, and the deadline a
// command carries, fixed from the time of dispatch) is left out.
type sameEntry struct {
	Subject string
	Header  nats.Header
	Data    string
}

func sameEntries(t *testing.T, msgs []*nats.Msg) []sameEntry {
	t.Helper()
	out := make([]sameEntry, 0, len(msgs))
	for _, m := range msgs {
		h := nats.Header{}
		for k, v := range m.Header {
			h[k] = v
		}
		h.Del(protocol.HeaderTime)
		data := m.Data
		if protocol.HeaderGet(m.Header, protocol.HeaderEntryKind) == string(protocol.KindCommand) {
			var cmd map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(m.Data, &cmd))
			require.Contains(t, cmd, "deadline_unix_ms")
			delete(cmd, "deadline_unix_ms")
			var err error
			data, err = json.Marshal(cmd)
			require.NoError(t, err)
		}
		out = append(out, sameEntry{Subject: m.Subject, Header: h, Data: string(data)})
	}
	return out
}

// TestTypedAndAPIWritesStoreTheSameEntries makes the same writes through the
// typed Go API (as the same callers, WithCaller) and through the NATS API,
// each on a ledger of its own: a dispatch, its result card, a report refused
// after parsing (the wrong status), one refused by the parser (a bad
// after_execution), the accepted report, a consume refused (another agent's)
// and the consume. Both ledgers must hold the
// same entries, byte for byte, the refusals' requests as received included.
func TestTypedAndAPIWritesStoreTheSameEntries(t *testing.T) {
	c := newCall("turn-same", "call-same", 3)
	c.card.Metadata = c.meta
	rc := c.resultCard(protocol.StatusSuccess)
	ok := c.reportReq(protocol.StatusSuccess, rc.CardID)
	ok.Identity.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	wrongStatus := ok
	wrongStatus.Payload.Status = protocol.StatusFailed
	unparsable := ok
	unparsable.Payload.AfterExecution = "later"

	consumed := protocol.ConsumeRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id}
	notTheirs := consumed
	notTheirs.AgentID = "agent-other"
	run := func(t *testing.T, dispatch func(protocol.DispatchRequest) error, put func(protocol.Card) error, report func(protocol.ReportRequest) error, consume func(protocol.ConsumeRequest) error) {
		require.NoError(t, dispatch(c.dispatchReq()))
		require.NoError(t, put(rc))
		err := report(wrongStatus)
		e, refused := protocol.AsError(err)
		require.True(t, refused, "%v", err)
		require.Equal(t, protocol.CodeMismatch, e.Code)
		err = report(unparsable)
		e, refused = protocol.AsError(err)
		require.True(t, refused, "%v", err)
		require.Equal(t, protocol.CodeBadRequest, e.Code)
		require.NoError(t, report(ok))
		err = consume(notTheirs)
		e, refused = protocol.AsError(err)
		require.True(t, refused, "%v", err)
		require.Equal(t, protocol.CodeMismatch, e.Code)
		require.NoError(t, consume(consumed))
	}

	typed := newEnv(t)
	ctx := ctxT(t)
	worker := ledger.WithCaller(ctx, protocol.Caller{Project: project, Actor: agent})
	tool := ledger.WithCaller(ctx, protocol.Caller{Project: project, Actor: toolFn})
	run(t,
		func(r protocol.DispatchRequest) error { _, err := typed.l.Dispatch(worker, r); return err },
		func(card protocol.Card) error { _, err := typed.l.PutCard(tool, card); return err },
		func(r protocol.ReportRequest) error { _, err := typed.l.Report(tool, r); return err },
		func(r protocol.ConsumeRequest) error {
			_, err := typed.l.Consume(ledger.WithCaller(ctx, protocol.Caller{Project: project, Actor: r.AgentID}), r)
			return err
		})

	api := newEnv(t)
	serveAPI(t, api)
	wc := client.New(api.srv.Connect(t), client.WithActor(agent))
	tc := client.New(api.srv.Connect(t), client.WithActor(toolFn))
	run(t,
		func(r protocol.DispatchRequest) error { _, err := wc.Dispatch(ctx, r); return err },
		func(card protocol.Card) error { _, err := tc.PutCard(ctx, card); return err },
		func(r protocol.ReportRequest) error { _, err := tc.Report(ctx, r); return err },
		func(r protocol.ConsumeRequest) error { _, err := wc.Consume(ctx, r); return err })

	want := sameEntries(t, api.subjectEntries(t, ">"))
	got := sameEntries(t, typed.subjectEntries(t, ">"))
	kinds := map[string]int{}
	for _, e := range want {
		kinds[protocol.HeaderGet(e.Header, protocol.HeaderEntryKind)]++
	}
	t.Logf("%d entries: %v", len(want), kinds)
	require.Equal(t, 3, kinds[string(protocol.KindRejection)], "every refusal recorded: %v", kinds)
	require.Equal(t, 1, kinds[string(protocol.KindConsumed)], "%v", kinds)
	require.Equal(t, 1, kinds[string(protocol.KindReport)], "%v", kinds)
	require.Equal(t, want, got)
}
