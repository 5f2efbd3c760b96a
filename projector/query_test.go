package projector_test

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// scenarioViews builds the standard scenario and projects it.
func scenarioViews(t *testing.T) (*ledgertest.Env, *projector.Store, *projector.Queries) {
	t.Helper()
	e := ledgertest.New(t)
	e.Scenario(t, 12)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, newProjector(t, e, s, 16).CatchUp(ledgertest.Ctx(t)))
	return e, s, projector.NewQueries(s)
}

func kinds(items []projector.TimelineItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Kind)
	}
	return out
}

func TestQueriesAnswerTheScenario(t *testing.T) {
	_, _, q := scenarioViews(t)

	tl, err := q.Timeline("proj", "turn-special", projector.AsOf{})
	require.NoError(t, err)
	for i := 1; i < len(tl.Items); i++ {
		require.Less(t, tl.Items[i-1].Seq, tl.Items[i].Seq, "timeline in ledger order")
	}
	require.Equal(t, []string{
		"card", "command", "card", "report", "wakeup", "duplicate", "rejection", "card", "rejection", // override
		"card", "command", "rejection", // pending: unknown card
		"rejection", // bad dispatch
	}, kinds(tl.Items))

	story, err := q.CallStory("proj", "override", "", projector.AsOf{})
	require.NoError(t, err)
	require.Len(t, story.Calls, 1)
	st := story.Calls[0]
	require.Equal(t, projector.StateReported, st.State)
	require.Equal(t, protocol.StatusSuccess, st.Status)
	require.Equal(t, protocol.AfterSuspend, st.AfterExecution, "the report's own field is kept as sent")
	require.Equal(t, protocol.AfterTerminate, st.EffectiveAfterExecution, "__cg_control override wins")
	require.Equal(t, 1, st.Duplicates)
	require.Equal(t, 2, st.Rejections)
	require.Equal(t, string(protocol.CodeConflict), st.LastRejection)
	require.Equal(t, "worker-alice", st.WorkerTarget)
	require.Equal(t, []string{"card", "command", "card", "report", "wakeup", "duplicate", "rejection", "card", "rejection"}, kinds(story.Items))

	bad, _, err := q.CallState("proj", "turn-special", "bad", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, projector.StateRejected, bad.State)
	require.Equal(t, string(protocol.CodeBadRequest), bad.LastRejection)
	pending, _, err := q.CallState("proj", "turn-special", "pending", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, projector.StateDispatched, pending.State)
	require.Equal(t, string(protocol.CodeUnknownCard), pending.LastRejection)

	inbox, err := q.Inbox("proj", "alice", "", projector.AsOf{}, "", 0)
	require.NoError(t, err)
	var ids []string
	for _, e := range inbox.Items {
		ids = append(ids, e.ToolCallID+":"+e.State)
	}
	require.Equal(t, []string{"call-0:consumed", "call-2:pending", "call-4:pending", "call-6:consumed", "call-8:pending", "call-10:pending", "override:pending"}, ids)
	pend, err := q.Inbox("proj", "alice", projector.InboxPending, projector.AsOf{}, "", 0)
	require.NoError(t, err)
	require.Len(t, pend.Items, 5)
	require.Equal(t, protocol.AfterTerminate, pend.Items[4].EffectiveAfterExecution)

	cards, err := q.TurnCards("proj", "turn-special", projector.AsOf{})
	require.NoError(t, err)
	require.Len(t, cards.Items, 4)

	card, err := q.Card("proj", "rc-turn-special-override-success", projector.AsOf{})
	require.NoError(t, err)
	require.Len(t, card.Versions, 1)
	require.Contains(t, string(card.Card.Card), `"author_id":"tool.search"`)

	r, _, err := q.Roster("proj", "bob", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, "worker-bob", r.WorkerTarget)
}

func TestQueriesAsOfSequenceAndTime(t *testing.T) {
	_, _, q := scenarioViews(t)
	c0, _, err := q.CallState("proj", "turn-alice-0", "call-0", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, projector.StateConsumed, c0.State)

	before := projector.AsOf{Seq: c0.ConsumedSeq - 1}
	old, seq, err := q.CallState("proj", "turn-alice-0", "call-0", before)
	require.NoError(t, err)
	require.Equal(t, c0.ConsumedSeq-1, seq)
	require.Equal(t, projector.StateReported, old.State)
	in, err := q.Inbox("proj", "alice", "", before, "", 0)
	require.NoError(t, err)
	require.Equal(t, projector.InboxPending, in.Items[0].State)
	in, err = q.Inbox("proj", "alice", "", projector.AsOf{Seq: c0.ConsumedSeq}, "", 0)
	require.NoError(t, err)
	require.Equal(t, projector.InboxConsumed, in.Items[0].State)

	// As of a time just before the report: the call was only dispatched.
	atTime := projector.AsOf{Time: c0.ReportedAt.Add(-time.Nanosecond)}
	old, seq, err = q.CallState("proj", "turn-alice-0", "call-0", atTime)
	require.NoError(t, err)
	require.Less(t, seq, c0.ReportedSeq)
	require.Equal(t, projector.StateDispatched, old.State)

	// Before the turn began there is nothing to show.
	_, err = q.Timeline("proj", "turn-alice-0", projector.AsOf{Seq: 1})
	require.ErrorIs(t, err, protocol.ErrNotFound)
	_, err = q.Card("proj", c0.ToolCallCardID, projector.AsOf{Seq: c0.DispatchedSeq - 2})
	require.ErrorIs(t, err, protocol.ErrNotFound)
	_, err = q.Card("proj", c0.ToolCallCardID, projector.AsOf{Seq: c0.DispatchedSeq - 1})
	require.NoError(t, err)
}

func TestCallsFiltersAndPagination(t *testing.T) {
	_, _, q := scenarioViews(t)
	ids := func(p *projector.Page[projector.CallState]) []string {
		var out []string
		for _, c := range p.Items {
			out = append(out, c.ToolCallID)
		}
		return out
	}
	all := projector.AsOf{}
	page, err := q.Calls("proj", projector.CallFilter{Tool: "search"}, all, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"call-0", "call-3", "call-6", "call-9", "override"}, ids(page))

	page, err = q.Calls("proj", projector.CallFilter{Status: protocol.StatusFailed}, all, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"call-4", "call-9"}, ids(page))

	page, err = q.Calls("proj", projector.CallFilter{Tool: "search", Status: protocol.StatusSuccess}, all, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"call-0", "call-3", "call-6", "override"}, ids(page))

	page, err = q.Calls("proj", projector.CallFilter{State: projector.StateDispatched}, all, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"pending"}, ids(page))
	page, err = q.Calls("proj", projector.CallFilter{State: projector.StateRejected}, all, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{"bad"}, ids(page))

	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		page, err = q.Calls("proj", projector.CallFilter{Agent: "bob"}, all, cursor, 2)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Items), 2)
		got = append(got, ids(page)...)
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Equal(t, []string{"call-1", "call-3", "call-5", "call-7", "call-9", "call-11", "pending"}, got)

	first, err := q.Calls("proj", projector.CallFilter{}, all, "", 1)
	require.NoError(t, err)
	from := *first.Items[0].DispatchedAt
	page, err = q.Calls("proj", projector.CallFilter{From: from.Add(time.Nanosecond)}, all, "", 0)
	require.NoError(t, err)
	require.NotContains(t, ids(page), first.Items[0].ToolCallID)
	page, err = q.Calls("proj", projector.CallFilter{To: from}, all, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{first.Items[0].ToolCallID}, ids(page))
	// Both bounds at once (each alone is above): a wide window holds every
	// call, the first call's instant holds it alone.
	page, err = q.Calls("proj", projector.CallFilter{From: from.Add(-time.Hour), To: from.Add(time.Hour)}, all, "", 0)
	require.NoError(t, err)
	require.NotEmpty(t, ids(page))
	everyCall, err := q.Calls("proj", projector.CallFilter{}, all, "", 0)
	require.NoError(t, err)
	require.Equal(t, ids(everyCall), ids(page))
	page, err = q.Calls("proj", projector.CallFilter{From: from, To: from}, all, "", 0)
	require.NoError(t, err)
	require.Equal(t, []string{first.Items[0].ToolCallID}, ids(page))

	_, err = q.Calls("proj", projector.CallFilter{Status: "meh", State: "gone"}, all, "bogus", 0)
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	le, _ := protocol.AsError(err)
	require.Len(t, le.Violations, 2)
	_, err = q.Calls("proj", projector.CallFilter{}, all, "bogus!", 0)
	require.ErrorIs(t, err, protocol.ErrBadRequest)
}

func TestVerifyAgainstViews(t *testing.T) {
	e, s, _ := scenarioViews(t)
	ctx := ledgertest.Ctx(t)
	rep, err := s.VerifyStream(ctx, e.JS, "")
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	applied, head, err := s.ChainHead()
	require.NoError(t, err)
	require.Equal(t, applied, rep.LastSeq)
	require.Equal(t, head.String(), rep.Head)
}

func TestVerifyExportCatchesARewrittenChain(t *testing.T) {
	e, s, _ := scenarioViews(t)
	var buf bytes.Buffer
	_, err := e.L.Export(ledgertest.Ctx(t), &buf, 0)
	require.NoError(t, err)
	rep, err := s.VerifyExport(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)

	// An attacker edits a report and recomputes every later link and the
	// trailer: the file is self-consistent, but not with the views.
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var hdr stream.ExportHeader
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &hdr))
	prev := protocol.Genesis
	edited := uint64(0)
	for i := 1; i < len(lines)-1; i++ {
		var ee stream.ExportEntry
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &ee))
		if edited == 0 && strings.Contains(string(ee.Data), `"status":"failed"`) && ee.Headers[protocol.HeaderEntryKind][0] == "report" {
			ee.Data = bytes.Replace(ee.Data, []byte(`"status":"failed"`), []byte(`"status":"success"`), 1)
			edited = ee.Seq
		}
		l := protocol.NextLink(prev, ee.Seq, ee.Subject, nats.Header(ee.Headers), ee.Data)
		ee.Link, prev = l.String(), l
		b, err := json.Marshal(ee)
		require.NoError(t, err)
		lines[i] = string(b)
	}
	require.NotZero(t, edited)
	var tr stream.ExportTrailer
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &tr))
	tr.Head = prev.String()
	b, _ := json.Marshal(tr)
	lines[len(lines)-1] = string(b)
	forged := strings.Join(lines, "\n")

	self, err := stream.VerifyExport(strings.NewReader(forged))
	require.NoError(t, err)
	require.True(t, self.OK, "a rewritten file is self-consistent")
	rep, err = s.VerifyExport(strings.NewReader(forged))
	require.NoError(t, err)
	require.False(t, rep.OK)
	require.Equal(t, edited, rep.FirstBadSeq)
}

// TestTurnsHoldEveryEntryThatNamesThem checks placements the audit found
// missing: a refused dispatch that names its turn but no call (in headers,
// with a body that names neither), and a wakeup published by others whose
// headers name a turn and a call. A refused dispatch's call keeps the
// epoch it sent.
func TestTurnsHoldEveryEntryThatNamesThem(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "ann", Turn: "t9", ID: "c1", Epoch: 3, Tool: "echo"}
	noCall := c.Dispatch()
	noCall.Identity.ToolCallID = ""
	_, err := e.L.Dispatch(ctx, noCall)
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	bad := c.Dispatch()
	bad.Payload.AfterExecution = "later"
	_, err = e.L.Dispatch(ctx, bad)
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	_, err = e.JS.PublishMsg(ctx, &nats.Msg{Subject: protocol.WakeupSubject("v1", "proj", "main", "w1"), Data: []byte(`{"hello":1}`),
		Header: nats.Header{protocol.HeaderAgentTurnID: {"t9"}, protocol.HeaderToolCallID: {"c1"}}})
	require.NoError(t, err)

	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, newProjector(t, e, s, 16).CatchUp(ctx))
	q := projector.NewQueries(s)
	tl, err := q.Timeline("proj", "t9", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, []string{"rejection", "rejection", protocol.ViewKindExternalWakeup}, kinds(tl.Items))
	story, err := q.CallStory("proj", "c1", "", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, []string{"rejection", protocol.ViewKindExternalWakeup}, kinds(story.Items))
	require.Len(t, story.Calls, 1)
	require.Equal(t, uint64(3), story.Calls[0].TurnEpoch)
}
