package ledger_test

import (
	"encoding/json"
	"strings"
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
		// An atomic batch's id is random.
		h.Del("Nats-Batch-Id")
		if id := h.Get(protocol.HeaderMsgID); strings.HasPrefix(id, "approval.") {
			// An approval entry's id ends in the decision's time.
			h.Set(protocol.HeaderMsgID, id[:strings.LastIndexByte(id, '.')])
		}
		data := m.Data
		if protocol.HeaderGet(m.Header, protocol.HeaderEntryKind) == string(protocol.KindCommand) {
			var cmd map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(m.Data, &cmd))
			require.Contains(t, cmd, "deadline_unix_ms")
		}
		if len(data) > 0 && data[0] == '{' {
			var v any
			require.NoError(t, json.Unmarshal(data, &v))
			dropClock(v)
			var err error
			data, err = json.Marshal(v)
			require.NoError(t, err)
		}
		out = append(out, sameEntry{Subject: m.Subject, Header: h, Data: string(data)})
	}
	return out
}

// dropClock removes, at any depth, the members that come from the clock:
// times in unix milliseconds (a command's deadline, a held call's expiry, a
// decision's time), which differ between two ledgers run one after the
// other.
func dropClock(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if strings.HasSuffix(k, "_unix_ms") {
				delete(v, k)
				continue
			}
			dropClock(x)
		}
	case []any:
		for _, x := range v {
			dropClock(x)
		}
	}
}

// writes are the write operations of TestTypedAndAPIWritesStoreTheSameEntries,
// each made as its caller: the typed Go API's or the NATS API's.
type writes struct {
	dispatch func(protocol.DispatchRequest) error
	put      func(protocol.Card) error
	report   func(protocol.ReportRequest) error
	result   func(protocol.Card, protocol.ReportRequest) error
	consume  func(protocol.ConsumeRequest) error
	roster   func(protocol.RosterEntry) error
	attempt  func(protocol.AttemptStartRequest) error
	cancel   func(protocol.CancelRequest) error
	approve  func(protocol.ApprovalRequest) error
	deny     func(protocol.ApprovalRequest) error
	pause    func(protocol.ToolPauseRequest) error
	resume   func(protocol.ToolPauseRequest) error
	opCancel func(protocol.OperatorCancelRequest) error
}

// TestTypedAndAPIWritesStoreTheSameEntries makes the same writes through the
// typed Go API (as the same callers, WithCaller) and through the NATS API,
// each on a ledger of its own: a dispatch, its result card, a report refused
// after parsing (the wrong status), one refused by the parser (a bad
// after_execution), the accepted report, a consume refused (another agent's)
// and the consume; then a roster set, an attempt start, an agent's cancel,
// an operator's cancel, an approval and a denial of held calls, a pause and
// a resume, each also refused once (by the parser, or after it). Both
// ledgers must hold the same entries, byte for byte (but for the clock's
// fields), CG-Actor and the refusals' requests as received included.
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

	res := newCall("turn-same", "call-res", 3)
	res.card.Metadata = res.meta
	resCard := res.resultCard(protocol.StatusSuccess)
	resReq := res.reportReq(protocol.StatusSuccess, "")
	// A second report.result: its card first under the first one's id (a
	// conflict found after parsing), then under its own id with a result
	// the parser rewrites (spaces, <): the typed call takes the parser's
	// way there, and stores what it stores.
	res2 := newCall("turn-same", "call-res2", 3)
	res2.card.Metadata = res2.meta
	res2Card := res2.resultCard(protocol.StatusSuccess)
	takenID := res2Card
	takenID.CardID = resCard.CardID
	res2Card.Content = json.RawMessage(`{"status":"success", "result":{"html":"<b>", "n":1}}`)
	res2Req := res2.reportReq(protocol.StatusSuccess, res2Card.CardID)

	consumed := protocol.ConsumeRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id}
	notTheirs := consumed
	notTheirs.AgentID = "agent-other"
	const gated, approver, denier = "gated", "alice", "carol"
	att := newCall("turn-att", "call-att", 1)
	agentCancel := newCall("turn-cx", "call-cx", 1)
	opCancel := newCall("turn-ox", "call-ox", 1)
	held1, heldReq1 := deadlineCall("turn-h1", "call-h1", gated, 0)
	held2, heldReq2 := deadlineCall("turn-h2", "call-h2", gated, 0)
	refused := func(t *testing.T, err error, code protocol.Code) {
		t.Helper()
		e, refused := protocol.AsError(err)
		require.True(t, refused, "%v", err)
		require.Equal(t, code, e.Code, "%v", e)
	}
	run := func(t *testing.T, w writes) {
		require.NoError(t, w.dispatch(c.dispatchReq()))
		require.NoError(t, w.put(rc))
		refused(t, w.report(wrongStatus), protocol.CodeMismatch)
		refused(t, w.report(unparsable), protocol.CodeBadRequest)
		require.NoError(t, w.report(ok))
		// report.result: refused after parsing (its card's metadata not
		// the call's), by the parser (the card's status not the report's),
		// then stored with its card, and sent again.
		require.NoError(t, w.dispatch(res.dispatchReq()))
		badMeta := resCard
		badMeta.Metadata.TraceID = "another-trace"
		refused(t, w.result(badMeta, resReq), protocol.CodeMismatch)
		wrongResStatus := resReq
		wrongResStatus.Payload.Status = protocol.StatusFailed
		refused(t, w.result(resCard, wrongResStatus), protocol.CodeBadRequest)
		require.NoError(t, w.result(resCard, resReq))
		// Sent again: the card is held, the report a duplicate.
		require.NoError(t, w.result(resCard, resReq))
		require.NoError(t, w.dispatch(res2.dispatchReq()))
		refused(t, w.result(takenID, res2.reportReq(protocol.StatusSuccess, "")), protocol.CodeConflict)
		require.NoError(t, w.result(res2Card, res2Req))
		refused(t, w.consume(notTheirs), protocol.CodeMismatch)
		require.NoError(t, w.consume(consumed))

		refused(t, w.roster(protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "not a token"}), protocol.CodeBadRequest)
		require.NoError(t, w.roster(protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "worker-b"}))

		require.NoError(t, w.dispatch(att.dispatchReq()))
		start := protocol.AttemptStartRequest{ProjectID: project, AgentTurnID: att.turn, ToolCallID: att.id, ExecutorID: "exec-a", DeadlineUnixMS: 1_900_000_000_000}
		badStart := start
		badStart.ExecutorID = "exec a"
		refused(t, w.attempt(badStart), protocol.CodeBadRequest)
		require.NoError(t, w.attempt(start))

		require.NoError(t, w.dispatch(agentCancel.dispatchReq()))
		cx := protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: agentCancel.turn, ToolCallID: agentCancel.id, Reason: "not needed"}
		wrongAgent := cx
		wrongAgent.ToolCallID = "call-unknown"
		refused(t, w.cancel(wrongAgent), protocol.CodeUnknownCall)
		require.NoError(t, w.cancel(cx))

		require.NoError(t, w.dispatch(opCancel.dispatchReq()))
		ox := protocol.OperatorCancelRequest{ProjectID: project, AgentTurnID: opCancel.turn, ToolCallID: opCancel.id}
		refused(t, w.opCancel(ox), protocol.CodeBadRequest)
		ox.Reason = "runaway"
		require.NoError(t, w.opCancel(ox))

		require.NoError(t, w.dispatch(heldReq1))
		require.NoError(t, w.dispatch(heldReq2))
		wrongDigest := approvalOf(held1)
		wrongDigest.ArgumentsDigest = protocol.ArgumentsDigest(json.RawMessage(`{"x":1}`))
		refused(t, w.approve(wrongDigest), protocol.CodeMismatch)
		require.NoError(t, w.approve(approvalOf(held1)))
		require.NoError(t, w.deny(approvalOf(held2)))

		pause := protocol.ToolPauseRequest{ProjectID: project, ToolName: gated}
		refused(t, w.pause(pause), protocol.CodeBadRequest)
		pause.Reason = "maintenance"
		require.NoError(t, w.pause(pause))
		refused(t, w.pause(pause), protocol.CodeConflict)
		pause.Reason = "done"
		require.NoError(t, w.resume(pause))
	}

	typed := newEnv(t)
	ctx := ctxT(t)
	registerGated(t, typed.l, gated, 60_000, "")
	worker := ledger.WithCaller(ctx, protocol.Caller{Project: project, Actor: agent})
	tool := ledger.WithCaller(ctx, protocol.Caller{Project: project, Actor: toolFn})
	run(t, writes{
		dispatch: func(r protocol.DispatchRequest) error { _, err := typed.l.Dispatch(worker, r); return err },
		put:      func(card protocol.Card) error { _, err := typed.l.PutCard(tool, card); return err },
		report:   func(r protocol.ReportRequest) error { _, err := typed.l.Report(tool, r); return err },
		result: func(card protocol.Card, r protocol.ReportRequest) error {
			_, err := typed.l.ReportResult(tool, card, r)
			return err
		},
		consume: func(r protocol.ConsumeRequest) error {
			_, err := typed.l.Consume(ledger.WithCaller(ctx, protocol.Caller{Project: project, Actor: r.AgentID}), r)
			return err
		},
		roster:  func(r protocol.RosterEntry) error { _, err := typed.l.SetRoster(worker, r); return err },
		attempt: func(r protocol.AttemptStartRequest) error { _, err := typed.l.StartAttempt(tool, r); return err },
		cancel:  func(r protocol.CancelRequest) error { _, err := typed.l.Cancel(worker, r); return err },
		// The operator's and approvers' typed methods take their actor
		// as an argument, with no caller in ctx.
		approve: func(r protocol.ApprovalRequest) error { _, err := typed.l.Approve(ctx, approver, r); return err },
		deny:    func(r protocol.ApprovalRequest) error { _, err := typed.l.Deny(ctx, denier, r); return err },
		pause:   func(r protocol.ToolPauseRequest) error { _, err := typed.l.PauseTool(ctx, opsActor, r); return err },
		resume:  func(r protocol.ToolPauseRequest) error { _, err := typed.l.ResumeTool(ctx, opsActor, r); return err },
		opCancel: func(r protocol.OperatorCancelRequest) error {
			_, err := typed.l.OperatorCancel(ctx, opsActor, r)
			return err
		},
	})

	api := newEnv(t)
	registerGated(t, api.l, gated, 60_000, "")
	serveAPI(t, api)
	wc := client.New(api.srv.Connect(t), client.WithActor(agent))
	tc := client.New(api.srv.Connect(t), client.WithActor(toolFn))
	oc := client.New(api.srv.Connect(t))
	run(t, writes{
		dispatch: func(r protocol.DispatchRequest) error { _, err := wc.Dispatch(ctx, r); return err },
		put:      func(card protocol.Card) error { _, err := tc.PutCard(ctx, card); return err },
		report:   func(r protocol.ReportRequest) error { _, err := tc.Report(ctx, r); return err },
		result: func(card protocol.Card, r protocol.ReportRequest) error {
			_, err := tc.ReportResult(ctx, card, r)
			return err
		},
		consume: func(r protocol.ConsumeRequest) error { _, err := wc.Consume(ctx, r); return err },
		roster:  func(r protocol.RosterEntry) error { _, err := wc.SetRoster(ctx, r); return err },
		attempt: func(r protocol.AttemptStartRequest) error { _, err := tc.StartAttempt(ctx, r); return err },
		cancel:  func(r protocol.CancelRequest) error { _, err := wc.Cancel(ctx, r); return err },
		approve: func(r protocol.ApprovalRequest) error { _, err := oc.Approve(ctx, approver, r); return err },
		deny:    func(r protocol.ApprovalRequest) error { _, err := oc.Deny(ctx, denier, r); return err },
		pause:   func(r protocol.ToolPauseRequest) error { _, err := oc.PauseTool(ctx, opsActor, r); return err },
		resume:  func(r protocol.ToolPauseRequest) error { _, err := oc.ResumeTool(ctx, opsActor, r); return err },
		opCancel: func(r protocol.OperatorCancelRequest) error {
			_, err := oc.OperatorCancel(ctx, opsActor, r)
			return err
		},
	})

	want := sameEntries(t, api.subjectEntries(t, ">"))
	got := sameEntries(t, typed.subjectEntries(t, ">"))
	kinds := map[string]int{}
	for _, e := range want {
		kinds[protocol.HeaderGet(e.Header, protocol.HeaderEntryKind)]++
	}
	t.Logf("%d entries: %v", len(want), kinds)
	require.Equal(t, 13, kinds[string(protocol.KindRejection)], "every refusal recorded: %v", kinds)
	for _, k := range []protocol.EntryKind{protocol.KindRoster, protocol.KindAttempt, protocol.KindCancel, protocol.KindApproval, protocol.KindToolPause} {
		require.NotZero(t, kinds[string(k)], "%s: %v", k, kinds)
	}
	actors := map[string]int{}
	for _, e := range want {
		actors[protocol.HeaderGet(e.Header, protocol.HeaderActor)]++
	}
	for _, a := range []string{agent, toolFn, approver, denier, opsActor, ""} {
		require.NotZero(t, actors[a], "entries with CG-Actor %q: %v", a, actors)
	}
	require.Equal(t, 1, kinds[string(protocol.KindConsumed)], "%v", kinds)
	require.Equal(t, 4, kinds[string(protocol.KindReport)], "the tool's three (report, two report.results) and the ledger's for the denial: %v", kinds)
	require.Equal(t, want, got)
}
