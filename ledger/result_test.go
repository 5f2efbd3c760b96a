package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// resultCounts are the entries of one call: its report entries, the
// entries on a card's subject, its wakeups (to worker w1) and the
// report.result refusals recorded.
type resultCounts struct{ reports, cards, wakeups, rejections int }

func (e *env) resultCounts(t *testing.T, c call, cardID string) resultCounts {
	t.Helper()
	var n resultCounts
	n.reports = len(e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id)))
	n.cards = len(e.subjectEntries(t, protocol.CardSubject("v1", project, cardID)))
	for _, m := range e.subjectEntries(t, protocol.WakeupSubject("v1", project, channel, "w1")) {
		if m.Header.Get(protocol.HeaderToolCallID) == c.id {
			n.wakeups++
		}
	}
	for _, m := range e.subjectEntries(t, ">") {
		if protocol.HeaderGet(m.Header, protocol.HeaderEntryKind) != string(protocol.KindRejection) {
			continue
		}
		var r struct {
			Op string `json:"op"`
		}
		require.NoError(t, json.Unmarshal(m.Data, &r))
		if r.Op == protocol.OpReportResult {
			n.rejections++
		}
	}
	return n
}

// resultEnv's ledger stores a report.result as one atomic batch, whatever
// the replica count (the default on R1 is two appends: the tests that
// open their own ledger with a zero Config cover that).
func resultEnv(t testing.TB) *env {
	t.Helper()
	e := newEnvWith(t, ledger.Config{ResultWrites: ledger.ResultWritesBatch})
	_, err := e.l.SetRoster(ctxT(t), protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	return e
}

// TestReportResultStoresCardAndReportTogether: one report.result stores the
// card and the report entry next to each other (one batch), the report
// without tool_result_card_seq, and wakes the agent once; a retry answers
// duplicate, card and report, storing nothing.
func TestReportResultStoresCardAndReportTogether(t *testing.T) {
	e := resultEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-rr", "call-1", 1)
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	rc := c.resultCard(protocol.StatusSuccess)
	req := c.reportReq(protocol.StatusSuccess, "")

	out, err := e.l.ReportResult(ctx, rc, req)
	require.NoError(t, err)
	require.False(t, out.Duplicate)
	require.False(t, out.CardDuplicate)
	require.Equal(t, out.Seq-1, out.CardSeq, "card and report are stored together")
	require.Equal(t, rc.CardID, out.ToolResultCardID)
	require.Equal(t, protocol.StatusSuccess, out.Status)
	require.Equal(t, "w1", out.Wakeup.WorkerTarget)

	sc, err := e.l.GetCard(ctx, project, rc.CardID)
	require.NoError(t, err)
	require.Equal(t, out.CardSeq, sc.Seq)
	reports := e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, reports, 1)
	var entry map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(reports[0].Data, &entry))
	require.NotContains(t, entry, "tool_result_card_seq", "a report stored with its card names it by id")
	var re protocol.ReportEntry
	require.NoError(t, json.Unmarshal(reports[0].Data, &re))
	require.Equal(t, rc.CardID, re.ToolResultCardID)

	again, err := e.l.ReportResult(ctx, rc, req)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.True(t, again.CardDuplicate)
	require.Equal(t, out.Seq, again.Seq)
	require.Equal(t, out.CardSeq, again.CardSeq)
	require.Equal(t, resultCounts{reports: 1, cards: 1, wakeups: 1}, e.resultCounts(t, c, rc.CardID))
	e.l.Flush()
	rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateWoken, rec.State)
	require.Equal(t, out.Seq, rec.Claim.Seq)
}

// TestReportResultAfterPutCard: a card put before (card.put, then
// report.result) is held: the report is appended alone, carrying the card's
// sequence, and the answer says card_duplicate. A fresh ledger process,
// which does not remember the card, finds it the same way.
func TestReportResultAfterPutCard(t *testing.T) {
	e := resultEnv(t)
	ctx := ctxT(t)
	for i, fresh := range []bool{false, true} {
		c := newCall("turn-put", fmt.Sprintf("call-%d", i), 1)
		rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
		put, err := e.l.GetCard(ctx, project, rc.CardID)
		require.NoError(t, err)
		l := e.l
		if fresh {
			l, err = ledger.Open(ctx, e.nc, ledger.Config{})
			require.NoError(t, err)
			t.Cleanup(l.Close)
		}
		out, err := l.ReportResult(ctx, rc, c.reportReq(protocol.StatusSuccess, rc.CardID))
		require.NoError(t, err)
		require.False(t, out.Duplicate)
		require.True(t, out.CardDuplicate)
		require.Equal(t, put.Seq, out.CardSeq)
		reports := e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id))
		require.Len(t, reports, 1)
		var re protocol.ReportEntry
		require.NoError(t, json.Unmarshal(reports[0].Data, &re))
		require.Equal(t, put.Seq, re.ToolResultCardSeq, "the ledger knew the card's sequence: it fills it")
		require.Equal(t, resultCounts{reports: 1, cards: 1, wakeups: 1}, e.resultCounts(t, c, rc.CardID))
	}
}

// TestReportResultRefusalsStoreNothing: every refusal lists its violations
// under body.card.* and body.report.*, is recorded under report.result,
// and stores neither the card nor the report: bad input (every violation
// of both parts), a card whose metadata is not the call's, a status the
// card does not have, a different card under an id that holds one.
func TestReportResultRefusalsStoreNothing(t *testing.T) {
	e := resultEnv(t)
	ctx := ctxT(t)
	tool := ledger.WithCaller(ctx, protocol.Caller{Project: project, Actor: toolFn})
	c := newCall("turn-bad", "call-1", 1)
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	good := c.resultCard(protocol.StatusSuccess)
	req := c.reportReq(protocol.StatusSuccess, "")
	fields := func(err error, code protocol.Code) []string {
		t.Helper()
		le, refused := protocol.AsError(err)
		require.True(t, refused, "%v", err)
		require.Equal(t, code, le.Code, "%v", le)
		var out []string
		for _, v := range le.Violations {
			out = append(out, v.Field+" "+v.Code)
		}
		return out
	}

	bad := good
	bad.AuthorID, bad.Content = "someone-else", json.RawMessage(`{"status":"done"}`)
	badReq := req
	badReq.Payload.AfterExecution = "later"
	badReq.Payload.ToolResultCardID = "rc-other"
	_, err = e.l.ReportResult(tool, bad, badReq)
	require.Equal(t, []string{
		"body.card.content.status invalid_value",
		"body.report.after_execution invalid_value",
		"body.report.tool_result_card_id mismatch",
		"body.card.author_id mismatch",
	}, fields(err, protocol.CodeBadRequest))

	meta := good
	meta.Metadata = protocol.CardMetadata{TraceID: "t-x", ParentStepID: "p-x", StepID: "s-x"}
	_, err = e.l.ReportResult(tool, meta, req)
	require.Equal(t, []string{
		"body.card.metadata.trace_id mismatch",
		"body.card.metadata.parent_step_id mismatch",
		"body.card.metadata.step_id mismatch",
	}, fields(err, protocol.CodeMismatch))

	wrongStatus := req
	wrongStatus.Payload.Status = protocol.StatusPartial
	_, err = e.l.ReportResult(tool, good, wrongStatus)
	require.Equal(t, []string{"body.report.status mismatch"}, fields(err, protocol.CodeBadRequest))
	require.Equal(t, resultCounts{rejections: 3}, e.resultCounts(t, c, good.CardID))

	// A different card already under the id (put by card.put).
	other := good
	other.Content = json.RawMessage(`{"status":"success","result":{"text":"other"}}`)
	_, err = e.l.PutCard(ctx, other)
	require.NoError(t, err)
	_, err = e.l.ReportResult(tool, good, req)
	require.Equal(t, []string{"body.card.card_id conflict"}, fields(err, protocol.CodeConflict))
	require.Equal(t, resultCounts{cards: 1, rejections: 4}, e.resultCounts(t, c, good.CardID))
	// And once a ledger process that does not remember it races the batch
	// into it: the batch is refused whole, and so is the request.
	l2, err := ledger.Open(ctx, e.nc, ledger.Config{})
	require.NoError(t, err)
	t.Cleanup(l2.Close)
	_, err = l2.ReportResult(tool, good, req)
	require.Equal(t, []string{"body.card.card_id conflict"}, fields(err, protocol.CodeConflict))
	require.Equal(t, resultCounts{cards: 1, rejections: 5}, e.resultCounts(t, c, good.CardID))
}

// TestReportResultOverNATS: report.result through the API (client), as a
// tool service in another process sends it, with its refusal's paths.
func TestReportResultOverNATS(t *testing.T) {
	e := resultEnv(t)
	serveAPI(t, e)
	ctx := ctxT(t)
	tc := client.New(e.srv.Connect(t), client.WithActor(toolFn))
	c := newCall("turn-api", "call-1", 1)
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	rc := c.resultCard(protocol.StatusSuccess)

	stale := c.reportReq(protocol.StatusSuccess, rc.CardID)
	stale.Identity.TurnEpoch = 9
	_, err = tc.ReportResult(ctx, rc, stale)
	le, refused := protocol.AsError(err)
	require.True(t, refused, "%v", err)
	require.Equal(t, protocol.CodeStaleEpoch, le.Code)

	out, err := tc.ReportResult(ctx, rc, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.False(t, out.Duplicate)
	require.Equal(t, out.Seq-1, out.CardSeq)
	require.Equal(t, resultCounts{reports: 1, cards: 1, wakeups: 1, rejections: 1}, e.resultCounts(t, c, rc.CardID))
}

// TestReportResultRace: concurrent report.results for one call, through two
// ledger processes, some with one card and some with another (under
// another id): exactly one report is stored, with its one card; the same
// result is answered duplicate, the other a conflict; the other card is
// never stored; one wakeup.
func TestReportResultRace(t *testing.T) {
	e := resultEnv(t)
	ctx := ctxT(t)
	l2, err := ledger.Open(ctx, e.srv.Connect(t), ledger.Config{ResultWrites: ledger.ResultWritesBatch})
	require.NoError(t, err)
	t.Cleanup(l2.Close)
	for round := range 3 {
		c := newCall("turn-race", fmt.Sprintf("call-%d", round), 1)
		_, err := e.l.Dispatch(ctx, c.dispatchReq())
		require.NoError(t, err)
		cards := []protocol.Card{c.resultCard(protocol.StatusSuccess), c.resultCard(protocol.StatusSuccess)}
		cards[1].CardID += "-b"
		const n = 8
		outs := make([]protocol.ReportResultOutcome, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := e.l
				if i%2 == 1 {
					l = l2
				}
				outs[i], errs[i] = l.ReportResult(ctx, cards[i/4], c.reportReq(protocol.StatusSuccess, ""))
			}()
		}
		wg.Wait()
		accepted, winner := 0, ""
		for i := range n {
			if errs[i] == nil && !outs[i].Duplicate {
				accepted++
				winner = outs[i].ToolResultCardID
			}
		}
		require.Equal(t, 1, accepted, "exactly one accepted: %v", errs)
		for i := range n {
			if cards[i/4].CardID == winner {
				require.NoError(t, errs[i])
				continue
			}
			le, refused := protocol.AsError(errs[i])
			require.True(t, refused, "%v", errs[i])
			require.Equal(t, protocol.CodeConflict, le.Code)
		}
		loser := cards[0].CardID
		if winner == loser {
			loser = cards[1].CardID
		}
		got := e.resultCounts(t, c, winner)
		require.Equal(t, 1, got.reports)
		require.Equal(t, 1, got.cards)
		require.Equal(t, 1, got.wakeups)
		require.Empty(t, e.subjectEntries(t, protocol.CardSubject("v1", project, loser)), "the losing card is not stored")
	}
}

// TestReportResultCrashBetweenStepsThenRetry: a report.result that dies
// before its batch, after it, or after the wakeup is finished by a retry:
// one card, one report, one wakeup.
func TestReportResultCrashBetweenStepsThenRetry(t *testing.T) {
	e := resultEnv(t)
	e.l.SetReportLease(100 * time.Millisecond)
	for i, step := range []ledger.Step{ledger.StepResultChecked, ledger.StepAppended, ledger.StepWoken} {
		for _, restart := range []bool{false, true} {
			name := string(step)
			if restart {
				name += "_server_restart"
			}
			t.Run(name, func(t *testing.T) {
				e.resultCrashThenRetry(t, fmt.Sprintf("call-%d-%v", i, restart), step, restart)
			})
		}
	}
}

// resultCrashThenRetry crashes a report.result at step (restarting the
// NATS server there too, with restart) and retries it to its end.
func (e *env) resultCrashThenRetry(t *testing.T, id string, step ledger.Step, restart bool) {
	t.Helper()
	ctx := ctxT(t)
	c := newCall("turn-rcrash", id, 1)
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	rc := c.resultCard(protocol.StatusSuccess)
	req := c.reportReq(protocol.StatusSuccess, rc.CardID)
	var before func()
	if restart {
		before = func() { e.srv.Restart(t) }
	}
	e.l.SetAfterStep(crashOnce(step, before))
	_, err = e.l.ReportResult(ctx, rc, req)
	require.ErrorIs(t, err, errCrash)
	e.l.SetAfterStep(nil)
	if restart {
		waitConnected(t, e.nc)
	}
	if step == ledger.StepResultChecked {
		require.Equal(t, resultCounts{}, e.resultCounts(t, c, rc.CardID), "nothing published before the batch")
	}

	var out protocol.ReportResultOutcome
	deadline := time.Now().Add(time.Minute)
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, err = e.l.ReportResult(rctx, rc, req)
		cancel()
		if err == nil {
			break
		}
		_, refused := protocol.AsError(err)
		require.False(t, refused, "retry refused: %v", err)
		require.True(t, time.Now().Before(deadline), "never finished: %v", err)
	}
	require.Equal(t, step != ledger.StepResultChecked, out.Duplicate)
	require.Equal(t, step != ledger.StepResultChecked, out.CardDuplicate)
	require.Equal(t, resultCounts{reports: 1, cards: 1, wakeups: 1}, e.resultCounts(t, c, rc.CardID))
	e.l.Flush()
	rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateWoken, rec.State)
	require.Equal(t, out.Seq, rec.Claim.Seq)
}

// TestReportResultBatchHeaders: the entries of a batch hold what a card.put
// and a report hold (kind, identity, actor); the batch's own headers steer
// the server and are not chained.
func TestReportResultBatchHeaders(t *testing.T) {
	e := resultEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-hdr", "call-1", 1)
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	rc := c.resultCard(protocol.StatusSuccess)
	_, err = e.l.ReportResult(ledger.WithCaller(ctx, protocol.Caller{Project: project, Actor: toolFn}), rc, c.reportReq(protocol.StatusSuccess, ""))
	require.NoError(t, err)
	for _, m := range []*nats.Msg{
		e.subjectEntries(t, protocol.CardSubject("v1", project, rc.CardID))[0],
		e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id))[0],
	} {
		require.Equal(t, toolFn, m.Header.Get(protocol.HeaderActor), m.Subject)
		require.NotEmpty(t, m.Header.Get(protocol.HeaderEntryKind), m.Subject)
		for k := range m.Header {
			if strings.HasPrefix(k, "Nats-") {
				t.Logf("%s: %s = %s", m.Subject, k, m.Header.Get(k))
			}
		}
	}
}

// TestReportResultSequential: under Config.ResultWrites sequential the card and
// the report are two appends; the answers, the retries after a crash
// between them, and a different card's refusal are the batch's.
func TestReportResultSequential(t *testing.T) {
	srv := newEnv(t).srv
	nc := srv.Connect(t)
	l, err := ledger.Open(ctxT(t), nc, ledger.Config{ResultWrites: ledger.ResultWritesSequential, ReportLease: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(l.Close)
	e := &env{srv: srv, nc: nc, l: l}
	ctx := ctxT(t)
	_, err = l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	for i, step := range []ledger.Step{"", ledger.StepResultChecked, ledger.StepAppended} {
		c := newCall("turn-seq", fmt.Sprintf("call-%d", i), 1)
		_, err := l.Dispatch(ctx, c.dispatchReq())
		require.NoError(t, err)
		rc := c.resultCard(protocol.StatusSuccess)
		req := c.reportReq(protocol.StatusSuccess, "")
		if step != "" {
			l.SetAfterStep(crashOnce(step, nil))
			_, err = l.ReportResult(ctx, rc, req)
			require.ErrorIs(t, err, errCrash)
			l.SetAfterStep(nil)
		}
		var out protocol.ReportResultOutcome
		require.Eventually(t, func() bool {
			out, err = l.ReportResult(ctx, rc, req)
			_, refused := protocol.AsError(err)
			require.False(t, refused, "%v", err)
			return err == nil
		}, time.Minute, 10*time.Millisecond)
		require.Equal(t, step == ledger.StepAppended, out.Duplicate)
		require.Equal(t, step == ledger.StepAppended, out.CardDuplicate)
		require.Less(t, out.CardSeq, out.Seq)
		reports := e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id))
		require.Len(t, reports, 1)
		var re protocol.ReportEntry
		require.NoError(t, json.Unmarshal(reports[0].Data, &re))
		require.Equal(t, out.CardSeq, re.ToolResultCardSeq, "the card was appended first: its sequence is known")
		require.Equal(t, resultCounts{reports: 1, cards: 1, wakeups: 1, rejections: i}, e.resultCounts(t, c, rc.CardID))

		other := rc
		other.Content = json.RawMessage(`{"status":"success","result":{"text":"other"}}`)
		_, err = l.ReportResult(ctx, other, req)
		le, refused := protocol.AsError(err)
		require.True(t, refused, "%v", err)
		require.Equal(t, protocol.CodeConflict, le.Code)
	}
}

// TestClusterRacingReportResults: identical report.results racing through
// three ledgers of an R3 ledger on three nodes (batches staged in memory,
// one Raft proposal each): exactly one stores card and report, every other
// caller is answered duplicate, none gets an error; one card, one report.
func TestClusterRacingReportResults(t *testing.T) {
	ls := clusterLedgers(t)
	const rounds, callers = 6, 30
	for round := range rounds {
		c := newCall("turn-clr", fmt.Sprintf("call-%d", round), 1)
		_, err := ls[0].Dispatch(ctxT(t), c.dispatchReq())
		require.NoError(t, err)
		rc := c.resultCard(protocol.StatusSuccess)
		firsts, refusals, undefined := raceOutcomes(callers, ls, func(l *ledger.Ledger) (bool, error) {
			res, err := l.ReportResult(ctxT(t), rc, c.reportReq(protocol.StatusSuccess, ""))
			return !res.Duplicate, err
		})
		require.Empty(t, undefined, "round %d: every racing caller gets a definite answer", round)
		require.Empty(t, refusals, "round %d: identical report.results are never refused", round)
		require.Equal(t, 1, firsts, "round %d: exactly one caller's report was accepted", round)
		for _, l := range ls {
			sc, err := l.GetCard(ctxT(t), project, rc.CardID)
			require.NoError(t, err)
			require.Equal(t, rc.Content, sc.Card.Content)
		}
		counts := map[string]int{}
		_, err = ls[1].ReadEntries(ctxT(t), 1, func(m protocol.Entry) error {
			counts[m.Subject]++
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 1, counts[protocol.CardSubject("v1", project, rc.CardID)], "round %d: one card", round)
		require.Equal(t, 1, counts[protocol.ReportSubject("v1", project, channel, c.turn, c.id)], "round %d: one report", round)
	}
}

// BenchmarkReportResult answers calls one at a time (each dispatched
// first, outside the timer): report.result as one atomic batch, as two
// appends (Config.ResultWrites sequential), and card.put + report. On R1 file
// storage the batch's cost is the server's disk sync of its staging store.
func BenchmarkReportResult(b *testing.B) {
	for _, mode := range []string{"batch", "sequential", "put_report"} {
		b.Run(mode, func(b *testing.B) {
			e := resultEnv(b)
			ctx := ctxT(b)
			l := e.l
			if mode == "sequential" {
				var err error
				l, err = ledger.Open(ctx, e.nc, ledger.Config{ResultWrites: ledger.ResultWritesSequential})
				require.NoError(b, err)
				b.Cleanup(l.Close)
			}
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				c := newCall("turn-bench", fmt.Sprintf("call-%d", i), 1)
				_, err := l.Dispatch(ctx, c.dispatchReq())
				require.NoError(b, err)
				rc := c.resultCard(protocol.StatusSuccess)
				b.StartTimer()
				if mode == "put_report" {
					_, err = l.PutCard(ctx, rc)
					require.NoError(b, err)
					_, err = l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
				} else {
					_, err = l.ReportResult(ctx, rc, c.reportReq(protocol.StatusSuccess, ""))
				}
				require.NoError(b, err)
			}
		})
	}
}
