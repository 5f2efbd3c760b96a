package executor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// twoPhasePay is a two-phase tool counting its effects: Commit applies a
// token's effect once however often it is asked (idempotent per token, as
// Preparer requires); block, when set, stalls Commit after the effect.
type twoPhasePay struct {
	mu        sync.Mutex
	prepares  int
	commits   int // Commit calls
	effects   map[string]int
	rollbacks int
	block     chan struct{}
	committed chan struct{}
}

func newTwoPhasePay() *twoPhasePay {
	return &twoPhasePay{effects: map[string]int{}, committed: make(chan struct{}, 16)}
}

func (p *twoPhasePay) Run(context.Context, *executor.Call) executor.Outcome {
	return executor.Terminal("S-TOOL-CONFIG", "Run is never called for a Preparer", "")
}

func (p *twoPhasePay) Prepare(_ context.Context, call *executor.Call) (*executor.Prepared, executor.Outcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prepares++
	return &executor.Prepared{Token: "tok-" + call.ToolCallID, CommitDeadline: time.Now().Add(30 * time.Second)}, executor.Outcome{}
}

func (p *twoPhasePay) Commit(ctx context.Context, call *executor.Call, token string) executor.Outcome {
	p.mu.Lock()
	p.commits++
	if p.effects[token] == 0 {
		p.effects[token]++
	}
	block := p.block
	p.mu.Unlock()
	p.committed <- struct{}{}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
		}
	}
	return executor.Success(map[string]string{"paid": token})
}

func (p *twoPhasePay) Rollback(_ context.Context, _ *executor.Call, token string) executor.Outcome {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rollbacks++
	return executor.Terminal("S-TOOL-ABORTED", "payment "+token+" rolled back", "")
}

func (p *twoPhasePay) count() (prepares, commits, effects, rollbacks int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.effects {
		effects += n
	}
	return p.prepares, p.commits, effects, p.rollbacks
}

func awaitPrepared(t *testing.T, r *rig, c ledgertest.Call) *protocol.TwoPhase {
	t.Helper()
	var tp *protocol.TwoPhase
	require.Eventually(t, func() bool {
		var err error
		tp, err = r.L.TwoPhase(context.Background(), c.Project, c.Turn, c.ID)
		return err == nil && tp != nil
	}, time.Minute, 5*time.Millisecond, "call %s is prepared", c.ID)
	return tp
}

func decision(c ledgertest.Call, token string) protocol.DecisionRequest {
	return protocol.DecisionRequest{ProjectID: c.Project, AgentID: c.Agent, AgentTurnID: c.Turn, ToolCallID: c.ID, CommitToken: token}
}

// TestPreparerCommitAndAbort: the executor runs Prepare, records it, and
// waits; the worker's commit runs Commit and its result is the call's one
// report; an abort runs Rollback, whose outcome is the call's result.
func TestPreparerCommitAndAbort(t *testing.T) {
	pay := newTwoPhasePay()
	r := newRig(t, executor.Config{}, map[string]impl{"pay": {pay, def("pay", protocol.DeterminismSideEffectful, protocol.RetryPolicy{}, 4)}})
	ctx := ledgertest.Ctx(t)

	c := r.dispatch(t, callOpts{tool: "pay"})
	tp := awaitPrepared(t, r, c)
	require.Equal(t, "tok-"+c.ID, tp.CommitToken)
	_, err := r.L.Commit(ctx, decision(c, tp.CommitToken))
	require.NoError(t, err)
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)

	a := r.dispatch(t, callOpts{tool: "pay"})
	tp = awaitPrepared(t, r, a)
	_, err = r.L.Abort(ctx, decision(a, tp.CommitToken))
	require.NoError(t, err)
	_, tr, _ = r.result(t, a)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, "S-TOOL-ABORTED", errDetail(t, tr).TaxonomyCode)

	prepares, commits, effects, rollbacks := pay.count()
	require.Equal(t, 2, prepares)
	require.Equal(t, 1, commits)
	require.Equal(t, 1, effects)
	require.Equal(t, 1, rollbacks)
	require.Len(t, r.entriesOfKind(t, protocol.KindReport), 2, "one report per call")
}

// TestPreparerExecutorCrashBetweenCommitAndReport: the executor running
// Commit loses its connection after the effect and before the report (as
// a killed process would); the decision is delivered again to another
// executor, whose Commit finds the token applied: one effect, one report.
func TestPreparerExecutorCrashBetweenCommitAndReport(t *testing.T) {
	pay := newTwoPhasePay()
	pay.block = make(chan struct{})
	defer close(pay.block)
	r := &rig{Env: ledgertest.New(t), reg: prometheus.NewRegistry()}
	ctx := ledgertest.Ctx(t)
	_, err := r.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
	require.NoError(t, err)
	// Executor A: its own connection and ledger, to be cut.
	ncA := r.Srv.Connect(t)
	lA, err := ledger.Open(ctx, ncA, ledger.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	exA, err := executor.New(lA, ncA, executor.Config{AckWait: time.Second, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, exA.Register("pay", pay, def("pay", protocol.DeterminismSideEffectful, protocol.RetryPolicy{}, 4)))
	require.NoError(t, exA.Start(ctx))

	c := r.dispatch(t, callOpts{tool: "pay"})
	tp := awaitPrepared(t, r, c)
	_, err = r.L.Commit(ctx, decision(c, tp.CommitToken))
	require.NoError(t, err)
	select {
	case <-pay.committed:
	case <-time.After(time.Minute):
		t.Fatal("executor A never ran Commit")
	}
	ncA.Close() // the crash: no ack, no report

	pay.mu.Lock()
	pay.block = nil
	pay.mu.Unlock()
	r.start(t, executor.Config{AckWait: time.Second}, map[string]impl{"pay": {pay, def("pay", protocol.DeterminismSideEffectful, protocol.RetryPolicy{}, 4)}})
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	prepares, commits, effects, _ := pay.count()
	require.Equal(t, 1, prepares, "phase 1 ran once")
	require.Equal(t, 2, commits, "the decision was delivered again")
	require.Equal(t, 1, effects, "and applied once")
	require.Len(t, r.entriesOfKind(t, protocol.KindReport), 1, "exactly one report")
}
