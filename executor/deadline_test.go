package executor_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestSleepCallsEndByTheirDeadlineFromDispatch: 200 sleep calls of 500 ms
// with timeout_ms 2000, dispatched at once to an executor that runs 16 at a
// time. Deadlines count from dispatch, so at most the calls that fit in
// the first two seconds (16 slots x 4 sleeps) can succeed and the rest end
// timeout; counted from pick-up, as before, every call would succeed after
// ~6 s. Every call has its outcome, each timeout with the executor's code
// and a deadline equal to the one fixed at dispatch.
func TestSleepCallsEndByTheirDeadlineFromDispatch(t *testing.T) {
	r := newRig(t, executor.Config{}, nil)
	const n = 200
	calls := make([]ledgertest.Call, n)
	for i := range calls {
		calls[i] = r.dispatch(t, callOpts{tool: "sleep", args: `{"ms":500}`, timeoutMS: 2000})
	}
	success, timeout := 0, 0
	for _, c := range calls {
		rec, tr, _ := r.result(t, c)
		require.Equal(t, rec.DispatchedAt.Add(2000*1e6).UnixMilli(), rec.DeadlineUnixMS, "deadline fixed at dispatch")
		switch tr.Status {
		case protocol.StatusSuccess:
			success++
		case protocol.StatusTimeout:
			timeout++
			require.Equal(t, executor.CodeTimeout, errDetail(t, tr).TaxonomyCode)
		default:
			t.Fatalf("call %s: status %s", c.ID, tr.Status)
		}
	}
	t.Logf("%d succeeded, %d timed out", success, timeout)
	require.Equal(t, n, success+timeout)
	require.LessOrEqual(t, success, 16*4+16, "no call ran past its deadline counted from dispatch")
	require.Positive(t, timeout)
}

// TestCallStepIDFromCardMetadata: a command without CG-Step-Id gives the
// tool the tool.call card's metadata.step_id, as {step_id} does.
func TestCallStepIDFromCardMetadata(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	stepper := executor.ToolFunc(func(_ context.Context, call *executor.Call) executor.Outcome {
		mu.Lock()
		seen = append(seen, call.StepID)
		mu.Unlock()
		return executor.Success(map[string]any{"step": call.StepID})
	})
	r := newRig(t, executor.Config{}, map[string]impl{"stepper": {stepper, def("stepper", protocol.DeterminismPure, protocol.RetryPolicy{MaxAttempts: 1}, 4)}})
	c := r.dispatch(t, callOpts{tool: "stepper"})
	_, tr, _ := r.result(t, c)
	want := c.Meta().StepID
	require.NotEmpty(t, want)
	var out map[string]string
	require.NoError(t, json.Unmarshal(tr.Result, &out))
	require.Equal(t, want, out["step"])
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{want}, seen)
}
