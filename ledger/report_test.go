package ledger_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/stretchr/testify/require"
)

func TestReportHappyPathWakesCurrentWorkerTarget(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "worker_old"})
	require.NoError(t, err)
	_, err = e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "worker_b"})
	require.NoError(t, err)
	wakeups, err := e.nc.SubscribeSync(protocol.WakeupSubject("v1", project, channel, "*"))
	require.NoError(t, err)

	c := newCall("turn-1", "call-1", 3)
	d, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	require.False(t, d.Duplicate)
	require.Less(t, d.CardSeq, d.CommandSeq, "card must be written before the command")
	got, err := e.l.GetCard(ctx, project, c.card.CardID)
	require.NoError(t, err)
	require.Equal(t, d.CardSeq, got.Seq)

	rc := c.resultCard(protocol.StatusSuccess)
	_, err = e.l.PutCard(ctx, rc)
	require.NoError(t, err)
	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.False(t, out.Duplicate)
	require.NotZero(t, out.Seq)
	require.Equal(t, "worker_b", out.Wakeup.WorkerTarget)
	require.Equal(t, protocol.WakeupSubject("v1", project, channel, "worker_b"), out.Wakeup.Subject)

	m, err := wakeups.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, out.Wakeup.Subject, m.Subject)
	var w protocol.WakeupEntry
	require.NoError(t, json.Unmarshal(m.Data, &w))
	require.Equal(t, out.Seq, w.ReportSeq)
	require.Equal(t, "call-1", m.Header.Get(protocol.HeaderToolCallID))

	e.l.Flush()
	rec, err := e.l.GetCall(ctx, project, "turn-1", "call-1")
	require.NoError(t, err)
	require.Equal(t, protocol.StateWoken, rec.State)
	require.Equal(t, d.CommandSeq, rec.CommandSeq)
}

func TestDuplicateReportReturnsOriginalOutcomeAndIsRecorded(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-1", "call-1", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	first, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	second, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.True(t, second.Duplicate)
	require.Equal(t, first.Seq, second.Seq)
	require.Equal(t, first.ToolResultCardID, second.ToolResultCardID)
	require.Equal(t, first.Status, second.Status)
	require.NotZero(t, second.DuplicateSeq)
	require.True(t, first.Wakeup.Skipped, "no roster entry: wakeup skipped")
	require.Len(t, e.subjectEntries(t, "cg.v1.*.*.ledger.report.>"), 1)
	require.Len(t, e.subjectEntries(t, "cg.v1.*.*.ledger.duplicate.>"), 1)
	require.Len(t, e.subjectEntries(t, "cg.v1.*.*.ledger.wakeup_skipped.>"), 1)
}

func TestConflictingReportIsRejectedAndRecorded(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-1", "call-1", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	_, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	other := c.resultCard(protocol.StatusFailed)
	_, err = e.l.PutCard(ctx, other)
	require.NoError(t, err)
	_, err = e.l.Report(ctx, c.reportReq(protocol.StatusFailed, other.CardID))
	require.ErrorIs(t, err, protocol.ErrConflict)
	le, ok := protocol.AsError(err)
	require.True(t, ok)
	require.NotZero(t, le.Seq, "rejection entry written")
	rej := e.subjectEntries(t, "cg.v1.*.*.ledger.rejection.conflict")
	require.Len(t, rej, 1)
	var re protocol.RejectionEntry
	require.NoError(t, json.Unmarshal(rej[0].Data, &re))
	require.Equal(t, protocol.OpReport, re.Op)
	require.NotEmpty(t, re.Violations)
	require.Len(t, e.subjectEntries(t, "cg.v1.*.*.ledger.report.>"), 1)
}

func TestStaleEpochIsRejected(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-1", "call-1", 5)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	stale := c
	stale.epoch = 4
	_, err := e.l.Report(ctx, stale.reportReq(protocol.StatusSuccess, rc.CardID))
	require.ErrorIs(t, err, protocol.ErrStaleEpoch)
	require.Len(t, e.subjectEntries(t, "cg.v1.proj-1.chan-1.ledger.rejection.stale_epoch"), 1)
	require.Empty(t, e.subjectEntries(t, "cg.v1.*.*.ledger.report.>"))
	// The right epoch still gets through afterwards.
	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.False(t, out.Duplicate)
}

func TestWrongAuthorReportIsRejected(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-1", "call-1", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	req := c.reportReq(protocol.StatusSuccess, rc.CardID)
	req.SourceID = "tool.impostor"
	_, err := e.l.Report(ctx, req)
	require.ErrorIs(t, err, protocol.ErrMismatch)
	le, _ := protocol.AsError(err)
	require.Equal(t, "card.author_id", le.Violations[0].Field)
	require.Len(t, e.subjectEntries(t, "cg.v1.proj-1.chan-1.ledger.rejection.mismatch"), 1)
	require.Empty(t, e.subjectEntries(t, "cg.v1.*.*.ledger.report.>"))
}

func TestReportPointerValidation(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-1", "call-1", 1)
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)

	_, err = e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, "no-such-card"))
	require.ErrorIs(t, err, protocol.ErrUnknownCard)

	other := newCall("turn-1", "call-2", 1)
	wrongCall := other.resultCard(protocol.StatusSuccess)
	wrongCall.Metadata = protocol.CardMetadata{TraceID: "changed"}
	wrongCall.FunctionName = "not-echo"
	_, err = e.l.PutCard(ctx, wrongCall)
	require.NoError(t, err)
	_, err = e.l.Report(ctx, c.reportReq(protocol.StatusFailed, wrongCall.CardID))
	require.ErrorIs(t, err, protocol.ErrMismatch)
	le, _ := protocol.AsError(err)
	fields := map[string]bool{}
	for _, v := range le.Violations {
		fields[v.Field] = true
	}
	for _, f := range []string{"card.tool_call_id", "card.function_name", "card.metadata.trace_id", "card.metadata.parent_step_id", "card.metadata.step_id", "payload.status"} {
		require.True(t, fields[f], "violation for %s in %v", f, le.Violations)
	}

	_, err = e.l.Report(ctx, newCall("turn-9", "call-9", 1).reportReq(protocol.StatusSuccess, wrongCall.CardID))
	require.ErrorIs(t, err, protocol.ErrUnknownCall)
}

func TestConcurrentDuplicateReportsAcceptExactlyOne(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	c := newCall("turn-1", "call-1", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	const n = 50
	outs := make([]protocol.ReportOutcome, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			outs[i], errs[i] = e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
		}()
	}
	close(start)
	wg.Wait()
	accepted := 0
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, outs[0].Seq, outs[i].Seq)
		if !outs[i].Duplicate {
			accepted++
		}
	}
	require.Equal(t, 1, accepted)
	require.Len(t, e.subjectEntries(t, "cg.v1.*.*.ledger.report.>"), 1)
	require.Len(t, e.subjectEntries(t, "cg.v1.*.*.ledger.duplicate.>"), n-1)
	require.Len(t, e.subjectEntries(t, "cg.v1.*.*.cmd.agent.*.wakeup"), 1)
}

func TestErrorsMatchSentinels(t *testing.T) {
	err := error(&protocol.Error{Code: protocol.CodeStaleEpoch})
	require.True(t, errors.Is(err, protocol.ErrStaleEpoch))
	require.False(t, errors.Is(err, protocol.ErrConflict))
}
