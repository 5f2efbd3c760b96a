package executor_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// payTool is a side_effectful tool that counts its effects, and reconciles
// (when reconcile is set) by answering what reconcile says.
type payTool struct {
	effects    atomic.Int32
	reconciles atomic.Int32
	seen       atomic.Pointer[executor.Call]
	// before runs inside Run, before the effect.
	before    func(call *executor.Call)
	reconcile func(call *executor.Call) (bool, executor.Outcome, error)
}

func (p *payTool) Run(_ context.Context, call *executor.Call) executor.Outcome {
	if p.before != nil {
		p.before(call)
	}
	c := *call
	p.seen.Store(&c)
	p.effects.Add(1)
	return executor.Success(map[string]any{"paid": true, "attempt": call.Attempt})
}

// reconcilingPay is payTool with a Reconciler.
type reconcilingPay struct{ *payTool }

func (p reconcilingPay) Reconcile(_ context.Context, call *executor.Call) (bool, executor.Outcome, error) {
	p.reconciles.Add(1)
	c := *call
	p.seen.Store(&c)
	return p.reconcile(call)
}

func attemptEntries(t *testing.T, r *rig, c ledgertest.Call) []protocol.AttemptEntry {
	t.Helper()
	var out []protocol.AttemptEntry
	for _, e := range r.entriesOfKind(t, protocol.KindAttempt) {
		var a protocol.AttemptEntry
		require.NoError(t, json.Unmarshal(e.Data, &a))
		if a.ToolCallID == c.ID {
			require.Equal(t, protocol.AttemptSubject("v1", c.Project, c.Channel, c.Turn, c.ID), e.Subject)
			require.Equal(t, a.IdempotencyKey, nats.Header(e.Headers).Get(protocol.HeaderIdempotencyKey))
			out = append(out, a)
		}
	}
	return out
}

// crashedAttempt records attempt 1 of c as an executor that then died
// would have: on record, with no outcome.
func crashedAttempt(t *testing.T, r *rig, c ledgertest.Call) {
	t.Helper()
	res, err := r.L.StartAttempt(ledgertest.Ctx(t), protocol.AttemptStartRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, ExecutorID: "crashed-executor"})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.EqualValues(t, 1, res.Attempt)
}

func payDef() *protocol.ToolDefinition {
	return def("pay", protocol.DeterminismSideEffectful, protocol.RetryPolicy{MaxAttempts: 3, BaseMS: 1, CapMS: 2}, 4)
}

// TestSideEffectfulAttemptIsRecordedBeforeTheToolRuns: when the tool runs,
// its attempt is already on record, with the call's idempotency key.
func TestSideEffectfulAttemptIsRecordedBeforeTheToolRuns(t *testing.T) {
	pay := &payTool{}
	var r *rig
	onRecord := make(chan uint64, 1)
	pay.before = func(call *executor.Call) {
		// Read from the stream itself, not through the executor.
		js, err := r.NC.JetStream()
		if err == nil {
			var m *nats.RawStreamMsg
			m, err = js.GetLastMsg(stream.DefaultName, protocol.AttemptSubject("v1", call.ProjectID, call.ChannelID, call.AgentTurnID, call.ToolCallID))
			if err == nil {
				onRecord <- m.Sequence
				return
			}
		}
		onRecord <- 0
	}
	r = newRig(t, executor.Config{}, map[string]impl{"pay": {pay, payDef()}})
	c := r.dispatch(t, callOpts{tool: "pay"})
	rec, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.NotZero(t, <-onRecord, "the attempt entry was stored before Run")
	require.EqualValues(t, 1, pay.effects.Load())
	key := protocol.IdempotencyKey(c.Project, c.Turn, c.ID)
	require.Equal(t, key, pay.seen.Load().IdempotencyKey)
	require.Equal(t, 1, pay.seen.Load().Attempt)
	atts := attemptEntries(t, r, c)
	require.Len(t, atts, 1)
	require.EqualValues(t, 1, atts[0].Attempt)
	require.Equal(t, key, atts[0].IdempotencyKey)
	require.Equal(t, "cgledger.executor", atts[0].ExecutorID)
	require.NotZero(t, atts[0].DeadlineUnixMS)
	require.Empty(t, atts[0].PreviousOutcome)
	require.Empty(t, rec.Outcome, "an attempt that ran to its end has no attempt outcome")
}

// TestOpenAttemptIsNeverRunAgain: a delivery that finds an attempt on
// record without an outcome resolves it without running the tool (done,
// outcome unknown), or runs it as the next attempt only when its reconcile
// says the open one did nothing.
func TestOpenAttemptIsNeverRunAgain(t *testing.T) {
	for _, remote := range []bool{false, true} {
		name := "in_process"
		if remote {
			name = "over_the_api"
		}
		t.Run(name, func(t *testing.T) {
			t.Run("reconciled_done", func(t *testing.T) {
				pay := &payTool{reconcile: func(*executor.Call) (bool, executor.Outcome, error) {
					return true, executor.Success(map[string]any{"paid": true, "found": "upstream"}), nil
				}}
				r, c := openAttemptRig(t, remote, reconcilingPay{pay})
				rec, tr, _ := r.result(t, c)
				require.Equal(t, protocol.StatusSuccess, tr.Status)
				require.JSONEq(t, `{"paid":true,"found":"upstream"}`, string(tr.Result))
				require.Equal(t, protocol.AttemptReconciled, rec.Outcome)
				require.EqualValues(t, 0, pay.effects.Load(), "the tool is not run again")
				require.EqualValues(t, 1, pay.reconciles.Load())
				require.Equal(t, 1, pay.seen.Load().Attempt, "reconcile is asked about the open attempt")
				require.Equal(t, protocol.IdempotencyKey(c.Project, c.Turn, c.ID), pay.seen.Load().IdempotencyKey)
				require.Len(t, attemptEntries(t, r, c), 1)
				require.Len(t, r.entriesOfKind(t, protocol.KindReport), 1)
			})
			t.Run("reconciled_failure_is_marked", func(t *testing.T) {
				pay := &payTool{reconcile: func(*executor.Call) (bool, executor.Outcome, error) {
					return true, executor.Terminal("A-AUTH-001", "the card was declined", "use another card"), nil
				}}
				r, c := openAttemptRig(t, remote, reconcilingPay{pay})
				rec, tr, _ := r.result(t, c)
				require.Equal(t, protocol.StatusFailed, tr.Status)
				var d struct {
					TaxonomyCode string `json:"taxonomy_code"`
					Reconciled   bool   `json:"reconciled"`
				}
				require.NoError(t, json.Unmarshal(tr.Error.Detail, &d))
				require.Equal(t, "A-AUTH-001", d.TaxonomyCode)
				require.True(t, d.Reconciled)
				require.Equal(t, protocol.AttemptReconciled, rec.Outcome)
				require.EqualValues(t, 0, pay.effects.Load())
			})
			t.Run("reconciled_not_done", func(t *testing.T) {
				pay := &payTool{reconcile: func(*executor.Call) (bool, executor.Outcome, error) { return false, executor.Outcome{}, nil }}
				r, c := openAttemptRig(t, remote, reconcilingPay{pay})
				rec, tr, _ := r.result(t, c)
				require.Equal(t, protocol.StatusSuccess, tr.Status)
				require.EqualValues(t, 1, pay.effects.Load(), "run once, as attempt 2")
				require.Equal(t, 2, pay.seen.Load().Attempt)
				require.Empty(t, rec.Outcome)
				atts := attemptEntries(t, r, c)
				require.Len(t, atts, 2)
				require.EqualValues(t, 2, atts[1].Attempt)
				require.Equal(t, protocol.AttemptNotDone, atts[1].PreviousOutcome)
				require.Equal(t, atts[0].IdempotencyKey, atts[1].IdempotencyKey, "one key for every attempt of a call")
			})
			t.Run("no_reconciler_outcome_unknown", func(t *testing.T) {
				pay := &payTool{}
				r, c := openAttemptRig(t, remote, pay)
				rec, tr, _ := r.result(t, c)
				require.Equal(t, protocol.StatusFailed, tr.Status)
				d := errDetail(t, tr)
				require.Equal(t, protocol.CodeToolOutcomeUnknown, d.TaxonomyCode)
				require.Contains(t, d.FixHint, protocol.IdempotencyKey(c.Project, c.Turn, c.ID))
				require.Equal(t, protocol.AttemptOutcomeUnknown, rec.Outcome)
				require.EqualValues(t, 0, pay.effects.Load(), "never run again by itself")
				require.Len(t, attemptEntries(t, r, c), 1)
				require.Len(t, r.entriesOfKind(t, protocol.KindReport), 1)
				require.Equal(t, 1.0, counterSum(t, r, "cgledger_executor_side_effect_attempts_total"))
			})
		})
	}
}

// openAttemptRig starts a ledger, dispatches a pay call whose attempt 1 is
// on record without an outcome (its executor died), then an executor
// running tool as pay.
func openAttemptRig(t *testing.T, remote bool, tool executor.Tool) (*rig, ledgertest.Call) {
	t.Helper()
	var r *rig
	if remote {
		r = apiRig(t, ledgertest.New(t))
		r.conn = r.Srv.Connect(t)
		r.remote = client.New(r.conn)
	} else {
		r = &rig{Env: ledgertest.New(t), reg: prometheusNoop()}
		_, err := r.L.SetRoster(ledgertest.Ctx(t), protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
		require.NoError(t, err)
	}
	c := r.dispatch(t, callOpts{tool: "pay"})
	crashedAttempt(t, r, c)
	r.start(t, executor.Config{}, map[string]impl{"pay": {tool, payDef()}})
	return r, c
}

// TestIdempotentToolHasNoAttemptEntry: pure and idempotent tools keep their
// path (no attempt write), and still get the call's idempotency key, which
// the command carries too.
func TestIdempotentToolHasNoAttemptEntry(t *testing.T) {
	var seen atomic.Pointer[executor.Call]
	tool := executor.ToolFunc(func(_ context.Context, call *executor.Call) executor.Outcome {
		c := *call
		seen.Store(&c)
		return executor.Success("ok")
	})
	r := newRig(t, executor.Config{}, map[string]impl{
		"idem": {tool, def("idem", protocol.DeterminismIdempotent, protocol.RetryPolicy{MaxAttempts: 1}, 4)},
	})
	c := r.dispatch(t, callOpts{tool: "idem"})
	rec, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.Empty(t, rec.Outcome)
	require.Empty(t, r.entriesOfKind(t, protocol.KindAttempt), "no attempt entry on the idempotent path")
	key := protocol.IdempotencyKey(c.Project, c.Turn, c.ID)
	require.Equal(t, key, seen.Load().IdempotencyKey)
	cmds := r.entriesOfKind(t, protocol.KindCommand)
	require.Len(t, cmds, 1)
	require.Equal(t, key, nats.Header(cmds[0].Headers).Get(protocol.HeaderIdempotencyKey), "the command carries the key")
}

// TestSideEffectfulOnAToolCredential: a bound executor on a tool credential
// records its attempts over the API as that tool (NATS lets it publish
// attempt.start), and another tool's credential is refused the call's
// attempt.start, recorded.
func TestSideEffectfulOnAToolCredential(t *testing.T) {
	r := apiRig(t, ledgertest.NewAuth(t))
	ctx := ledgertest.Ctx(t)
	d := payDef()
	d.ProjectID = "proj"
	_, err := r.L.RegisterTool(ctx, d)
	require.NoError(t, err)
	svc := dialCred(t, r, auth.Grant{Role: auth.RoleTool, Project: "proj", Tool: "pay"})
	r.conn, r.remote = svc.nc, client.New(svc.nc, client.WithActor("pay"))
	pay := &payTool{}
	r.start(t, executor.Config{Bindings: []executor.Binding{{Project: "proj", Tool: "pay"}}}, map[string]impl{"pay": {pay, nil}})

	c := r.dispatch(t, callOpts{tool: "pay"})
	_, tr, _ := r.result(t, c)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.EqualValues(t, 1, pay.effects.Load())
	atts := r.entriesOfKind(t, protocol.KindAttempt)
	require.Len(t, atts, 1)
	require.Equal(t, "pay", nats.Header(atts[0].Headers).Get(protocol.HeaderActor))
	require.NoError(t, svc.nc.Flush())
	svc.mu.Lock()
	require.Empty(t, svc.refused, "NATS refused the tool nothing")
	svc.mu.Unlock()

	other := dialCred(t, r, auth.Grant{Role: auth.RoleTool, Project: "proj", Tool: "other"})
	c2 := r.dispatch(t, callOpts{tool: "idle"})
	_, err = client.New(other.nc, client.WithActor("other")).StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: "proj", AgentTurnID: c2.Turn, ToolCallID: c2.ID, ExecutorID: "x"})
	require.ErrorIs(t, err, protocol.ErrForbidden)
	var rejected bool
	for _, e := range r.entriesOfKind(t, protocol.KindRejection) {
		var re protocol.RejectionEntry
		require.NoError(t, json.Unmarshal(e.Data, &re))
		rejected = rejected || (re.Op == protocol.OpAttemptStart && re.Code == protocol.CodeForbidden)
	}
	require.True(t, rejected, "the refusal is recorded")
	require.Empty(t, attemptEntries(t, r, c2))
}
