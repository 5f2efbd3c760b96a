package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// openLedger opens one more ledger process on its own connection, with no
// grace after a deadline (the tests are about the deadline itself).
func openLedger(t *testing.T, srv *natstest.Server) (*ledger.Ledger, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	l, err := ledger.Open(ctxT(t), srv.Connect(t), ledger.Config{Registerer: reg, DeadlineGrace: -1, ApprovalLease: -1})
	require.NoError(t, err)
	t.Cleanup(l.Close)
	_, err = l.SetRoster(ctxT(t), protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	return l, reg
}

func startKeeper(t *testing.T, l *ledger.Ledger, ackWait time.Duration) *ledger.DeadlineKeeper {
	t.Helper()
	k, err := l.StartDeadlineKeeper(ctxT(t), ledger.DeadlineKeeperConfig{AckWait: ackWait})
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Stop(context.Background()) })
	return k
}

// deadlineCall is a call to tool (a tool.call card naming it) with
// timeout_ms.
func deadlineCall(turn, id, tool string, timeoutMS int64) (call, protocol.DispatchRequest) {
	c := newCall(turn, id, 1)
	c.card.Content = json.RawMessage(fmt.Sprintf(`{"tool_name":%q,"arguments":{}}`, tool))
	req := c.dispatchReq()
	req.Subject = protocol.ToolCommandSubject("v1", project, channel, tool)
	req.Payload.ToolName = tool
	req.Payload.TimeoutMS = timeoutMS
	return c, req
}

func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// awaitWoken waits (a minute at most: a loaded machine) for the call to
// have its outcome, and returns the record.
func awaitWoken(t *testing.T, l *ledger.Ledger, c call) *protocol.CallRecord {
	t.Helper()
	var rec *protocol.CallRecord
	require.Eventually(t, func() bool {
		r, err := l.GetCall(context.Background(), project, c.turn, c.id)
		if err != nil || r.State != protocol.StateWoken {
			return false
		}
		rec = r
		return true
	}, time.Minute, 20*time.Millisecond, "call %s never got its outcome", c.id)
	return rec
}

// requireLedgerTimeout checks that c ended timeout, recorded by the ledger
// once: one report entry, its result card with R-TIMEOUT-002, a wakeup,
// and the cancel sent to the tool.
func requireLedgerTimeout(t *testing.T, e *env, l *ledger.Ledger, c call) {
	t.Helper()
	rec := awaitWoken(t, l, c)
	require.NotNil(t, rec.Claim)
	require.Equal(t, protocol.StatusTimeout, rec.Claim.Status)
	require.Equal(t, protocol.DeadlineSourceID, rec.Claim.SourceID)
	require.Len(t, e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id)), 1, "one report entry")
	require.Empty(t, e.subjectEntries(t, protocol.DuplicateSubject("v1", project, channel, c.turn, c.id)), "no duplicate")
	card, err := l.GetCard(ctxT(t), project, rec.Claim.ToolResultCardID)
	require.NoError(t, err)
	var content struct {
		Status string `json:"status"`
		Error  struct {
			Detail struct {
				TaxonomyCode string `json:"taxonomy_code"`
				Deadline     int64  `json:"deadline_unix_ms"`
			} `json:"detail"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(card.Card.Content, &content))
	require.Equal(t, protocol.StatusTimeout, content.Status)
	require.Equal(t, protocol.TaxonomyDeadlineTimeout, content.Error.Detail.TaxonomyCode)
	require.Equal(t, rec.DeadlineUnixMS, content.Error.Detail.Deadline)
	require.Eventually(t, func() bool {
		ok, err := l.Canceled(context.Background(), project, channel, c.turn, c.id)
		return err == nil && ok
	}, time.Minute, 20*time.Millisecond, "the cancel goes to the tool")
	require.True(t, rec.Claim.WakeupSeq > 0, "the worker is woken")
}

// TestDispatchFixesTheDeadline: dispatch records deadline_unix_ms from
// timeout_ms (else the tool's default), the command carries the same
// value, a repeat answers it unchanged, and a dispatcher cannot set it.
func TestDispatchFixesTheDeadline(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: project, ToolName: "slowtool", Description: "d",
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.slowtool", AfterExecution: protocol.AfterSuspend,
		Parameters: json.RawMessage(`{"type":"object"}`), Limits: protocol.ToolLimits{TimeoutMSDefault: 7000, TimeoutMSMax: 9000}})
	require.NoError(t, err)
	cases := []struct {
		id        string
		timeoutMS int64
		want      time.Duration
	}{{"d-default", 0, 7 * time.Second}, {"d-asked", 8000, 8 * time.Second}, {"d-capped", 60000, 9 * time.Second}}
	for _, tc := range cases {
		c, req := deadlineCall("turn-dl", tc.id, "slowtool", tc.timeoutMS)
		res, err := e.l.Dispatch(ctx, req)
		require.NoError(t, err)
		rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, rec.DispatchedAt.Add(tc.want).UnixMilli(), rec.DeadlineUnixMS, tc.id)
		require.Equal(t, rec.DeadlineUnixMS, res.DeadlineUnixMS)
		cmds := e.subjectEntries(t, req.Subject)
		var p protocol.ToolCommandPayload
		require.NoError(t, json.Unmarshal(cmds[len(cmds)-1].Data, &p))
		require.Equal(t, rec.DeadlineUnixMS, p.DeadlineUnixMS, "the command carries the recorded deadline")
		again, err := e.l.Dispatch(ctx, req)
		require.NoError(t, err)
		require.True(t, again.Duplicate)
		require.Equal(t, rec.DeadlineUnixMS, again.DeadlineUnixMS)
	}
	_, req := deadlineCall("turn-dl", "d-forged", "slowtool", 0)
	req.Payload.DeadlineUnixMS = time.Now().Add(time.Hour).UnixMilli()
	_, err = e.l.Dispatch(ctx, req)
	pe, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeBadRequest, pe.Code)
	require.Equal(t, "payload.deadline_unix_ms", pe.Violations[0].Field)
	require.Equal(t, protocol.VForbidden, pe.Violations[0].Code)
}

// TestLedgerKeepsDeadlineOfUnansweredCalls: a registered tool whose
// service takes the command and never answers, and a tool nobody serves:
// each call ends timeout, recorded once by the ledger, the worker woken,
// the cancel written.
func TestLedgerKeepsDeadlineOfUnansweredCalls(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	_, err := l.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: project, ToolName: "mute", Description: "never answers",
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.mute", AfterExecution: protocol.AfterSuspend,
		Parameters: json.RawMessage(`{"type":"object"}`)})
	require.NoError(t, err)
	// The service: a consumer that takes the command and then stays silent.
	js, err := jetstream.New(e.nc)
	require.NoError(t, err)
	svc, err := js.CreateOrUpdateConsumer(ctx, stream.DefaultName, jetstream.ConsumerConfig{Durable: "mute-svc",
		FilterSubject: protocol.ToolCommandSubject("v1", project, channel, "mute"), AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	startKeeper(t, l, 5*time.Second)

	served, req := deadlineCall("turn-mute", "c1", "mute", 1000)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	batch, err := svc.Fetch(1, jetstream.FetchMaxWait(30*time.Second))
	require.NoError(t, err)
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	require.Len(t, got, 1, "the service took the command")
	var p protocol.ToolCommandPayload
	require.NoError(t, json.Unmarshal(got[0].Data(), &p))
	require.NotZero(t, p.DeadlineUnixMS, "the service reads the deadline from the command")

	nobody, req2 := deadlineCall("turn-nobody", "c1", "unserved", 1000)
	_, err = l.Dispatch(ctx, req2)
	require.NoError(t, err)

	requireLedgerTimeout(t, e, l, served)
	requireLedgerTimeout(t, e, l, nobody)
	require.Equal(t, 2.0, counterSum(t, reg, "cgledger_ledger_deadline_timeouts_total"))
	require.Len(t, e.subjectEntries(t, protocol.WakeupSubject("v1", project, channel, "w1")), 2, "one wakeup each")
}

// TestLateReportIsRefusedAndTheTimeoutStands: a report after the deadline
// is answered conflict with violation late, recorded as a rejection, and
// the timeout stays the call's outcome. With no keeper running, the late
// report itself records the timeout first.
func TestLateReportIsRefusedAndTheTimeoutStands(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	for _, withKeeper := range []bool{true, false} {
		turn := fmt.Sprintf("turn-late-%v", withKeeper)
		c, req := deadlineCall(turn, "c1", "echo", 1)
		if withKeeper {
			k := startKeeper(t, l, 5*time.Second)
			_, err := l.Dispatch(ctx, req)
			require.NoError(t, err)
			requireLedgerTimeout(t, e, l, c)
			require.NoError(t, k.Stop(ctx))
		} else {
			_, err := l.Dispatch(ctx, req)
			require.NoError(t, err)
			rec, err := l.GetCall(ctx, project, c.turn, c.id)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return time.Now().After(rec.Deadline()) }, time.Minute, 5*time.Millisecond)
		}
		rc := c.resultCard(protocol.StatusSuccess)
		_, err := l.PutCard(ctx, rc)
		require.NoError(t, err)
		_, err = l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
		pe, ok := protocol.AsError(err)
		require.True(t, ok, "%v", err)
		require.Equal(t, protocol.CodeConflict, pe.Code)
		require.Equal(t, protocol.VLate, pe.Violations[0].Code, pe.Violations[0].Message)
		requireLedgerTimeout(t, e, l, c)
	}
	require.Equal(t, 2.0, counterSum(t, reg, "cgledger_ledger_late_reports_total"))
	require.Len(t, e.subjectEntries(t, protocol.Root+".v1."+project+".*.ledger.rejection.>"), 2, "each late report is recorded")
}

// TestReportRacingTheDeadlineHasOneOutcome: many calls whose tool reports
// right at the deadline while two keepers watch: each call has exactly one
// report entry, and its outcome agrees with what the reporter was told.
func TestReportRacingTheDeadlineHasOneOutcome(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	l2, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	startKeeper(t, l1, 5*time.Second)
	startKeeper(t, l2, 5*time.Second)
	const n = 40
	var wg sync.WaitGroup
	accepted := make([]bool, n)
	calls := make([]call, n)
	for i := range n {
		c, req := deadlineCall("turn-race", fmt.Sprintf("c%d", i), "echo", 300)
		calls[i] = c
		_, err := l1.Dispatch(ctx, req)
		require.NoError(t, err)
		rc := c.resultCard(protocol.StatusSuccess)
		_, err = l1.PutCard(ctx, rc)
		require.NoError(t, err)
		rec, err := l1.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Aim at the deadline, a little before or after it: not a
			// synchronisation (either outcome is checked), a point in time.
			select {
			case <-time.After(time.Until(rec.Deadline().Add(time.Duration((i%10)*4-30) * time.Millisecond))):
			case <-ctx.Done():
				return
			}
			l := l1
			if i%2 == 1 {
				l = l2
			}
			_, err := l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
			if err == nil {
				accepted[i] = true
				return
			}
			pe, ok := protocol.AsError(err)
			if !ok || pe.Code != protocol.CodeConflict {
				t.Errorf("call %s: report: %v", c.id, err)
			}
		}()
	}
	wg.Wait()
	won := 0
	for _, a := range accepted {
		if a {
			won++
		}
	}
	t.Logf("%d reports accepted, %d calls timed out", won, n-won)
	for i, c := range calls {
		rec := awaitWoken(t, l1, c)
		want := protocol.StatusTimeout
		if accepted[i] {
			want = protocol.StatusSuccess
		}
		require.Equal(t, want, rec.Claim.Status, "call %s: the outcome is the one answered", c.id)
		require.Len(t, e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id)), 1, "call %s: one report entry", c.id)
	}
}

// TestTwoLedgersRecordEachTimeoutOnce: two serve processes, each with its
// keeper on the shared consumer: every timeout is recorded exactly once.
func TestTwoLedgersRecordEachTimeoutOnce(t *testing.T) {
	e := newEnv(t)
	l1, reg1 := openLedger(t, e.srv)
	l2, reg2 := openLedger(t, e.srv)
	ctx := ctxT(t)
	startKeeper(t, l1, 5*time.Second)
	startKeeper(t, l2, 5*time.Second)
	const n = 50
	calls := make([]call, n)
	for i := range n {
		c, req := deadlineCall("turn-two", fmt.Sprintf("c%d", i), "unserved", 500)
		calls[i] = c
		l := l1
		if i%2 == 1 {
			l = l2
		}
		_, err := l.Dispatch(ctx, req)
		require.NoError(t, err)
	}
	for _, c := range calls {
		rec := awaitWoken(t, l1, c)
		require.Equal(t, protocol.StatusTimeout, rec.Claim.Status)
		require.Len(t, e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id)), 1)
	}
	require.Equal(t, float64(n), counterSum(t, reg1, "cgledger_ledger_deadline_timeouts_total")+counterSum(t, reg2, "cgledger_ledger_deadline_timeouts_total"))
	require.Empty(t, e.subjectEntries(t, protocol.Root+".v1."+project+".*.ledger.duplicate.>"))
	require.Empty(t, e.subjectEntries(t, protocol.Root+".v1."+project+".*.ledger.rejection.>"))
}

// TestKeeperRestartedAcrossADeadline: the keeper takes a command, stops
// before its deadline, and a new one (another process) starts after it:
// the timeout is recorded once.
func TestKeeperRestartedAcrossADeadline(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	k := startKeeper(t, l1, 2*time.Second)
	c, req := deadlineCall("turn-restart", "c1", "unserved", 1500)
	_, err := l1.Dispatch(ctx, req)
	require.NoError(t, err)
	js, err := jetstream.New(e.nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		cons, err := js.Consumer(ctx, stream.DefaultName, ledger.DefaultDeadlineDurable+"v1")
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 1
	}, time.Minute, 10*time.Millisecond, "the keeper took the command")
	require.NoError(t, k.Stop(ctx))
	rec, err := l1.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return time.Now().After(rec.Deadline()) }, time.Minute, 10*time.Millisecond)
	rec, err = l1.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State, "nobody kept the deadline while stopped")

	l2, _ := openLedger(t, e.srv)
	startKeeper(t, l2, 2*time.Second)
	requireLedgerTimeout(t, e, l2, c)
}

// TestDeadlineWithAnOpenAttemptIsOutcomeUnknown: a side_effectful call
// whose attempt is on record and whose deadline passes with no report
// may have had its effect. The ledger records it failed,
// S-TOOL-OUTCOME-UNKNOWN, attempt_outcome outcome_unknown, never timeout
// (which a worker may take as safe to call again); a call with no attempt
// still ends timeout.
func TestDeadlineWithAnOpenAttemptIsOutcomeUnknown(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	_, err := l.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: project, ToolName: "pay", Description: "moves money",
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.pay", AfterExecution: protocol.AfterSuspend,
		Parameters: json.RawMessage(`{"type":"object"}`), Determinism: protocol.DeterminismSideEffectful})
	require.NoError(t, err)
	startKeeper(t, l, 5*time.Second)

	started, req := deadlineCall("turn-pay", "c1", "pay", 1000)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	at, err := l.StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: project, AgentTurnID: started.turn, ToolCallID: started.id, ExecutorID: "svc-1"})
	require.NoError(t, err)
	require.True(t, at.Started)
	// The service dies here, after the effect, before any report.
	never, req2 := deadlineCall("turn-pay", "c2", "pay", 1000)
	_, err = l.Dispatch(ctx, req2)
	require.NoError(t, err)

	rec := awaitWoken(t, l, started)
	require.NotNil(t, rec.Claim)
	require.Equal(t, protocol.StatusFailed, rec.Claim.Status)
	require.Equal(t, protocol.DeadlineSourceID, rec.Claim.SourceID)
	require.Equal(t, protocol.AttemptOutcomeUnknown, rec.Claim.AttemptOutcome)
	card, err := l.GetCard(ctx, project, rec.Claim.ToolResultCardID)
	require.NoError(t, err)
	var content struct {
		Status string `json:"status"`
		Error  struct {
			Code   string `json:"code"`
			Detail struct {
				TaxonomyCode string `json:"taxonomy_code"`
				Attempts     int    `json:"attempts"`
				FixHint      string `json:"fix_hint"`
			} `json:"detail"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(card.Card.Content, &content))
	require.Equal(t, protocol.StatusFailed, content.Status)
	require.Equal(t, protocol.CodeToolOutcomeUnknown, content.Error.Detail.TaxonomyCode)
	require.Equal(t, 1, content.Error.Detail.Attempts)
	require.NotEmpty(t, content.Error.Detail.FixHint)
	require.Len(t, e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, started.turn, started.id)), 1, "one report entry")

	// Without an attempt on record, the deadline is a plain timeout.
	requireLedgerTimeout(t, e, l, never)
	require.Equal(t, 1.0, counterSum(t, reg, "cgledger_ledger_attempt_outcomes_total"))
}

// TestKeeperAcksAReportedCallAtItsReport: a call this process reports
// leaves the deadline keeper's pending set at its report, not at its
// deadline (an hour away here), whether the keeper had its command first
// (before the report) or the report came first (before the keeper started).
// A call nobody reports stays pending for its deadline.
func TestKeeperAcksAReportedCallAtItsReport(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	js, err := jetstream.New(e.nc)
	require.NoError(t, err)
	pending := func() int {
		cons, err := js.Consumer(ctx, stream.DefaultName, ledger.DefaultDeadlineDurable+"v1")
		if err != nil {
			return -1
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return -1
		}
		return info.NumAckPending + int(info.NumPending)
	}
	report := func(c call) {
		t.Helper()
		rc := c.resultCard(protocol.StatusSuccess)
		_, err := l.PutCard(ctx, rc)
		require.NoError(t, err)
		_, err = l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
		require.NoError(t, err)
	}
	const hour = int64(time.Hour / time.Millisecond)

	// Reported before the keeper runs: its first delivery finds it woken.
	early, req := deadlineCall("turn-ack", "early", "echo", hour)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	report(early)
	waiting, req := deadlineCall("turn-ack", "waiting", "echo", hour)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	startKeeper(t, l, 5*time.Second)
	require.Eventually(t, func() bool { return pending() == 1 }, time.Minute, 20*time.Millisecond,
		"the reported call is acknowledged, the waiting one is pending")

	// Reported after the keeper handed its command back.
	late, req := deadlineCall("turn-ack", "late", "echo", hour)
	_, err = l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		cons, err := js.Consumer(ctx, stream.DefaultName, ledger.DefaultDeadlineDurable+"v1")
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 2
	}, time.Minute, 20*time.Millisecond, "the keeper holds both commands")
	report(late)
	require.Eventually(t, func() bool { return pending() == 1 }, time.Minute, 20*time.Millisecond,
		"the call reported after the keeper took its command is acknowledged at its report")
	rec, err := l.GetCall(ctx, project, waiting.turn, waiting.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State, "the unreported call still waits for its deadline")
}
