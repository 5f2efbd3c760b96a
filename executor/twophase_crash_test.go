package executor_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// Crashes of the ledger and of the executor between prepare, commit and
// rollback (issue 24; docs/side-effects.md "Two-phase commit"). A "process"
// is a connection with its own ledger and executor on it; it dies by
// closing that connection, so nothing it had in flight is acked.

// process is a serve-like process: a ledger and an executor running pay on
// one connection of their own. wrap, when set, wraps the executor's ledger.
type process struct {
	nc *nats.Conn
	l  *ledger.Ledger
	ex *executor.Executor
}

// ledgerProcess is a process with a ledger only (the worker's API side).
func ledgerProcess(t *testing.T, r *rig) *process {
	t.Helper()
	p := &process{nc: r.Srv.Connect(t)}
	var err error
	p.l, err = ledger.Open(ledgertest.Ctx(t), p.nc, ledger.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	return p
}

func startProcess(t *testing.T, r *rig, tool executor.Tool, wrap func(executor.Ledger) executor.Ledger) *process {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	p := ledgerProcess(t, r)
	var err error
	var l executor.Ledger = p.l
	if wrap != nil {
		l = wrap(p.l)
	}
	p.ex, err = executor.New(l, p.nc, executor.Config{AckWait: time.Second, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, p.ex.Register("pay", tool, def("pay", protocol.DeterminismSideEffectful, protocol.RetryPolicy{}, 4)))
	require.NoError(t, p.ex.Start(ctx))
	t.Cleanup(func() {
		if !p.nc.IsClosed() {
			p.ex.Stop(context.Background())
		}
	})
	return p
}

// kill is the process's death: its connection goes, with whatever it had
// not acked or published.
func (p *process) kill() { p.nc.Close() }

func crashRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{Env: ledgertest.New(t), reg: prometheus.NewRegistry()}
	_, err := r.L.SetRoster(ledgertest.Ctx(t), protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
	require.NoError(t, err)
	return r
}

func (r *rig) decisionEntries(t *testing.T, c ledgertest.Call) []protocol.DecisionEntry {
	t.Helper()
	var out []protocol.DecisionEntry
	for _, e := range r.entriesOfKind(t, protocol.KindDecision) {
		var d protocol.DecisionEntry
		require.NoError(t, json.Unmarshal(e.Data, &d))
		if d.ToolCallID == c.ID && d.AgentTurnID == c.Turn {
			out = append(out, d)
		}
	}
	return out
}

// requireOneEffect: the call succeeded with one decision (commit), one
// report, phase 1 once and the payment applied once.
func requireOneEffect(t *testing.T, r *rig, pay *twoPhasePay, c ledgertest.Call) {
	t.Helper()
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	ds := r.decisionEntries(t, c)
	require.Len(t, ds, 1, "exactly one decision")
	require.Equal(t, protocol.DecisionCommit, ds[0].Decision)
	require.Len(t, r.entriesOfKind(t, protocol.KindReport), 1, "exactly one report")
	prepares, _, effects, rollbacks := pay.count()
	require.Equal(t, 1, prepares, "phase 1 ran once")
	require.Equal(t, 1, effects, "the payment applied once")
	require.Zero(t, rollbacks)
}

// TestTwoPhaseLedgerDiesBetweenPrepareAndCommit: the process that recorded
// the prepare dies, the NATS server restarts on the same store, a new
// ledger and executor start; the worker's commit on the new ledger is the
// one decision, delivered to the new executor: Commit once, one report.
func TestTwoPhaseLedgerDiesBetweenPrepareAndCommit(t *testing.T) {
	r := crashRig(t)
	pay := newTwoPhasePay()
	a := startProcess(t, r, pay, nil)
	c := r.dispatch(t, callOpts{tool: "pay"})
	tp := awaitPrepared(t, r, c)
	a.kill()
	r.Srv.Restart(t)

	b := startProcess(t, r, pay, nil)
	got, err := b.l.TwoPhase(ledgertest.Ctx(t), c.Project, c.Turn, c.ID)
	require.NoError(t, err)
	require.Equal(t, protocol.PhasePrepared, got.State, "the prepare survived the restart")
	_, err = b.l.Commit(ledgertest.Ctx(t), decision(c, tp.CommitToken))
	require.NoError(t, err)
	requireOneEffect(t, r, pay, c)
	_, commits, _, _ := pay.count()
	require.Equal(t, 1, commits)
}

// TestTwoPhaseLedgerDiesBetweenDecisionAndReport: the worker's commit is
// stored and the tool is running Commit when the NATS server (and the
// ledger process that stored the decision) dies; after the restart the
// executor reports on its reconnected connection: one decision, one
// report, one effect (Commit may be asked again if the decision was
// redelivered meanwhile; it is idempotent per token).
func TestTwoPhaseLedgerDiesBetweenDecisionAndReport(t *testing.T) {
	r := crashRig(t)
	pay := newTwoPhasePay()
	pay.block = make(chan struct{})
	startProcess(t, r, pay, nil)
	api := ledgerProcess(t, r) // the worker's side: it stores the decision

	c := r.dispatch(t, callOpts{tool: "pay"})
	tp := awaitPrepared(t, r, c)
	_, err := api.l.Commit(ledgertest.Ctx(t), decision(c, tp.CommitToken))
	require.NoError(t, err)
	select {
	case <-pay.committed:
	case <-time.After(time.Minute):
		t.Fatal("the executor never ran Commit")
	}
	api.kill()
	r.Srv.Restart(t)
	pay.mu.Lock()
	close(pay.block)
	pay.block = nil
	pay.mu.Unlock()

	requireOneEffect(t, r, pay, c)
	_, commits, _, _ := pay.count()
	require.GreaterOrEqual(t, commits, 1)
}

// recordingLedger records the executor's Prepare answers; crash, when set,
// runs after a prepare is recorded and before the executor sees the answer.
type recordingLedger struct {
	executor.Ledger
	mu      sync.Mutex
	answers []protocol.PrepareResult
	crash   func()
}

func (l *recordingLedger) Prepare(ctx context.Context, req protocol.PrepareRequest) (protocol.PrepareResult, error) {
	res, err := l.Ledger.Prepare(ctx, req)
	if err == nil {
		l.mu.Lock()
		l.answers = append(l.answers, res)
		l.mu.Unlock()
		if l.crash != nil {
			l.crash()
		}
	}
	return res, err
}

func (l *recordingLedger) prepareAnswers() []protocol.PrepareResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]protocol.PrepareResult(nil), l.answers...)
}

// TestTwoPhaseExecutorDiesBetweenPrepareAndAck: executor A records the
// prepare and dies before acking the command; the redelivery to executor B
// repeats the recorded prepare (answered duplicate, its wakeup published
// again: deduplicated to the same entry) and acks; Prepare never runs
// again. The worker's commit then runs Commit once: one report.
func TestTwoPhaseExecutorDiesBetweenPrepareAndAck(t *testing.T) {
	r := crashRig(t)
	pay := newTwoPhasePay()
	var a *process
	recA := &recordingLedger{}
	recA.crash = func() { a.kill() }
	a = startProcess(t, r, pay, func(l executor.Ledger) executor.Ledger { recA.Ledger = l; return recA })
	c := r.dispatch(t, callOpts{tool: "pay"})
	tp := awaitPrepared(t, r, c)
	require.Eventually(t, func() bool { return len(recA.prepareAnswers()) == 1 }, time.Minute, 5*time.Millisecond)
	first := recA.prepareAnswers()[0]
	require.False(t, first.Duplicate)
	require.NotZero(t, first.WakeupSeq)

	recB := &recordingLedger{}
	startProcess(t, r, pay, func(l executor.Ledger) executor.Ledger { recB.Ledger = l; return recB })
	require.Eventually(t, func() bool { return len(recB.prepareAnswers()) == 1 }, time.Minute, 5*time.Millisecond,
		"the redelivered command repeats the recorded prepare")
	again := recB.prepareAnswers()[0]
	require.True(t, again.Duplicate)
	require.Equal(t, first.Seq, again.Seq)
	require.Equal(t, first.WakeupSeq, again.WakeupSeq, "the wakeup is published again, deduplicated")
	require.Len(t, r.entriesOfKind(t, protocol.KindWakeup), 1)
	require.Len(t, r.entriesOfKind(t, protocol.KindPrepared), 1)

	_, err := r.L.Commit(ledgertest.Ctx(t), decision(c, tp.CommitToken))
	require.NoError(t, err)
	requireOneEffect(t, r, pay, c)
	_, commits, _, _ := pay.count()
	require.Equal(t, 1, commits)
}

// shortPay is twoPhasePay with a commit deadline of in.
type shortPay struct {
	*twoPhasePay
	in time.Duration
}

func (p shortPay) Prepare(ctx context.Context, call *executor.Call) (*executor.Prepared, executor.Outcome) {
	pr, o := p.twoPhasePay.Prepare(ctx, call)
	pr.CommitDeadline = time.Now().Add(p.in)
	return pr, o
}

// TestTwoPhaseAutoAbortOfAReportedCall: a prepared call whose tool service
// reported it without waiting for a decision; at the commit deadline the
// deadline keeper still stores the ledger's abort (it does not read the
// call's state), which is delivered to the tool: the executor finds the
// call answered and only acks it (docs/protocol.md "The decision, on the
// tool's subject"): no Rollback, no second report.
func TestTwoPhaseAutoAbortOfAReportedCall(t *testing.T) {
	r := crashRig(t)
	pay := shortPay{newTwoPhasePay(), 500 * time.Millisecond}
	startProcess(t, r, pay, nil)
	c := r.dispatch(t, callOpts{tool: "pay"})
	tp := awaitPrepared(t, r, c)

	ctx := ledgertest.Ctx(t)
	_, err := r.L.PutCard(ctx, c.ResultCard(protocol.StatusFailed, `null`))
	require.NoError(t, err)
	_, err = r.L.Report(ctx, c.Report(protocol.StatusFailed))
	require.NoError(t, err)
	k, err := r.L.StartDeadlineKeeper(ctx, ledger.DeadlineKeeperConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Stop(context.Background()) })

	var ds []protocol.DecisionEntry
	require.Eventually(t, func() bool { ds = r.decisionEntries(t, c); return len(ds) == 1 }, time.Minute, 10*time.Millisecond)
	require.Equal(t, protocol.DecisionAbort, ds[0].Decision)
	require.Equal(t, protocol.DecidedByCommitDeadline, ds[0].DecidedBy)
	require.Equal(t, tp.CommitToken, ds[0].CommitToken)

	cons, err := r.JS.Consumer(ctx, stream.DefaultName, "cgledger-tool-pay")
	require.NoError(t, err)
	decisionSeq := r.entriesOfKind(t, protocol.KindDecision)[0].Seq
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream >= decisionSeq && info.NumAckPending == 0
	}, time.Minute, 10*time.Millisecond, "the decision is acked")
	_, _, _, rollbacks := pay.count()
	require.Zero(t, rollbacks, "a reported call is not rolled back")
	require.Len(t, r.entriesOfKind(t, protocol.KindReport), 1, "one report: the tool's")
	_, err = r.L.Commit(ctx, decision(c, tp.CommitToken))
	pe, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeConflict, pe.Code)
}
