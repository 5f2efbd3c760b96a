package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

var errCrash = errors.New("simulated crash")

// reportSteps are the points a report can crash at before its answer. The
// mark that follows for the report's own writer runs after the answer.
var reportSteps = []ledger.Step{ledger.StepAppended, ledger.StepWoken}

// crashOnce returns a hook that fails the first time step is reached.
func crashOnce(step ledger.Step, before func()) func(ledger.Step) error {
	var fired atomic.Bool
	return func(s ledger.Step) error {
		if s == step && fired.CompareAndSwap(false, true) {
			if before != nil {
				before()
			}
			return errCrash
		}
		return nil
	}
}

// retryReport retries a report until it succeeds or the deadline passes, as
// an executor's redelivery would.
func retryReport(t *testing.T, l *ledger.Ledger, req protocol.ReportRequest) protocol.ReportOutcome {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := l.Report(ctx, req)
		cancel()
		if err == nil {
			return out
		}
		_, refused := protocol.AsError(err)
		require.False(t, refused, "retry refused: %v", err)
		require.True(t, time.Now().Before(deadline), "report never succeeded: %v", err)
	}
}

// assertExactlyOneReport checks the ledger holds one report entry for the call
// and its record is complete.
func assertExactlyOneReport(t *testing.T, e *env, c call, out protocol.ReportOutcome) {
	t.Helper()
	reports := e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, reports, 1, "exactly one report entry for %s/%s", c.turn, c.id)
	meta, err := reports[0].Metadata()
	require.NoError(t, err)
	require.Equal(t, meta.Sequence.Stream, out.Seq)
	e.l.Flush()
	rec, err := e.l.GetCall(ctxT(t), project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateWoken, rec.State)
	require.Equal(t, out.Seq, rec.Claim.Seq)
}

func TestReportCrashAfterEachStepThenRetry(t *testing.T) {
	e := newEnv(t)
	// A retry after a crash waits out the crashed report's lease.
	e.l.SetReportLease(100 * time.Millisecond)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	for i, step := range reportSteps {
		t.Run(string(step), func(t *testing.T) {
			c := newCall("turn-crash", fmt.Sprintf("call-%d", i), 1)
			rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
			req := c.reportReq(protocol.StatusSuccess, rc.CardID)
			e.l.SetAfterStep(crashOnce(step, nil))
			_, err := e.l.Report(ctx, req)
			require.ErrorIs(t, err, errCrash)
			e.l.SetAfterStep(nil)

			out := retryReport(t, e.l, req)
			assertExactlyOneReport(t, e, c, out)
			// Every crash point is after the append: the retry finds the
			// stored report.
			require.True(t, out.Duplicate)
			wakeups := 0
			for _, m := range e.subjectEntries(t, protocol.WakeupSubject("v1", project, channel, "w1")) {
				if m.Header.Get(protocol.HeaderToolCallID) == c.id {
					wakeups++
				}
			}
			require.Equal(t, 1, wakeups, "one wakeup for the call")
		})
	}
}

func TestReportNATSServerRestartBetweenSteps(t *testing.T) {
	e := newEnv(t)
	// A retry after a crash waits out the crashed report's lease.
	e.l.SetReportLease(100 * time.Millisecond)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	for i, step := range reportSteps {
		t.Run(string(step), func(t *testing.T) {
			c := newCall("turn-restart", fmt.Sprintf("call-%d", i), 1)
			rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
			req := c.reportReq(protocol.StatusSuccess, rc.CardID)
			e.l.SetAfterStep(crashOnce(step, func() { e.srv.Restart(t) }))
			_, err := e.l.Report(ctx, req)
			require.ErrorIs(t, err, errCrash)
			e.l.SetAfterStep(nil)
			waitConnected(t, e.nc)

			out := retryReport(t, e.l, req)
			assertExactlyOneReport(t, e, c, out)
		})
	}
}

// TestReportRestartMidFlightThenRetry restarts the server inside a step and
// lets the interrupted report carry on (it may fail on the dead connection),
// then retries, as a real executor would.
func TestReportRestartMidFlightThenRetry(t *testing.T) {
	e := newEnv(t)
	// A retry after a crash waits out the crashed report's lease.
	e.l.SetReportLease(100 * time.Millisecond)
	for i, step := range reportSteps {
		t.Run(string(step), func(t *testing.T) {
			c := newCall("turn-midflight", fmt.Sprintf("call-%d", i), 1)
			rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
			req := c.reportReq(protocol.StatusSuccess, rc.CardID)
			var fired atomic.Bool
			e.l.SetAfterStep(func(s ledger.Step) error {
				if s == step && fired.CompareAndSwap(false, true) {
					e.srv.Restart(t)
				}
				return nil
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = e.l.Report(ctx, req)
			cancel()
			e.l.SetAfterStep(nil)
			waitConnected(t, e.nc)
			out := retryReport(t, e.l, req)
			assertExactlyOneReport(t, e, c, out)
		})
	}
}

func waitConnected(t *testing.T, nc *nats.Conn) {
	t.Helper()
	require.Eventually(t, nc.IsConnected, time.Minute, 10*time.Millisecond, "client reconnects after restart")
}

func TestDispatchCrashNeverLeavesCommandWithoutCard(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	for i, step := range []ledger.Step{ledger.StepDispatchCard, ledger.StepDispatchRecord, ledger.StepDispatchCommand} {
		t.Run(string(step), func(t *testing.T) {
			c := newCall("turn-dispatch", fmt.Sprintf("call-%d", i), 1)
			e.l.SetAfterStep(crashOnce(step, nil))
			_, err := e.l.Dispatch(ctx, c.dispatchReq())
			require.ErrorIs(t, err, errCrash)
			e.l.SetAfterStep(nil)
			// Whatever the crash left, a command never exists without its card.
			for _, m := range e.subjectEntries(t, "cg.v1.*.*.cmd.tool.>") {
				sc, err := e.l.GetCard(ctx, project, "cc-"+m.Header.Get(protocol.HeaderAgentTurnID)+"-"+m.Header.Get(protocol.HeaderToolCallID))
				require.NoError(t, err)
				require.Less(t, sc.Seq, mustSeq(t, m))
			}
			res, err := e.l.Dispatch(ctx, c.dispatchReq())
			require.NoError(t, err)
			require.NotZero(t, res.CommandSeq)
			again, err := e.l.Dispatch(ctx, c.dispatchReq())
			require.NoError(t, err)
			require.True(t, again.Duplicate)
			require.Equal(t, res.CommandSeq, again.CommandSeq)
			n := 0
			for _, m := range e.subjectEntries(t, "cg.v1.*.*.cmd.tool.>") {
				if m.Header.Get(protocol.HeaderToolCallID) == c.id && m.Header.Get(protocol.HeaderAgentTurnID) == c.turn {
					n++
				}
			}
			require.Equal(t, 1, n, "one command for the call")
		})
	}
}

func mustSeq(t *testing.T, m *nats.Msg) uint64 {
	t.Helper()
	meta, err := m.Metadata()
	require.NoError(t, err)
	return meta.Sequence.Stream
}

func TestTenThousandDistinctCallsAllAccepted(t *testing.T) {
	e := newEnv(t)
	// A volume test, not a deadline test: under -race on a loaded 2-core
	// machine 10k calls can take longer than the usual minute.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const n, workers = 10000, 32
	var accepted atomic.Int64
	jobs := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				c := newCall(fmt.Sprintf("turn-%d", i/10), fmt.Sprintf("call-%d", i), 1)
				if _, err := e.l.Dispatch(ctx, c.dispatchReq()); err != nil {
					errs <- err
					return
				}
				rc := c.resultCard(protocol.StatusSuccess)
				if _, err := e.l.PutCard(ctx, rc); err != nil {
					errs <- err
					return
				}
				out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
				if err != nil {
					errs <- err
					return
				}
				if !out.Duplicate {
					accepted.Add(1)
				}
			}
		}()
	}
	for i := range n {
		select {
		case jobs <- i:
		case err := <-errs:
			t.Fatalf("call %d: %v", i, err)
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	require.EqualValues(t, n, accepted.Load())
	js, err := e.nc.JetStream()
	require.NoError(t, err)
	info, err := js.StreamInfo(stream.DefaultName, &nats.StreamInfoRequest{SubjectsFilter: "cg.v1.*.*.ledger.report.>"})
	require.NoError(t, err)
	require.Len(t, info.State.Subjects, n)
	for subj, count := range info.State.Subjects {
		require.EqualValues(t, 1, count, subj)
	}
}

func TestResumeFinishesAStuckClaim(t *testing.T) {
	e := newEnv(t)
	// A retry after a crash waits out the crashed report's lease.
	e.l.SetReportLease(100 * time.Millisecond)
	ctx := ctxT(t)
	for i, step := range reportSteps {
		c := newCall("turn-resume", fmt.Sprintf("call-%d", i), 1)
		rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
		e.l.SetAfterStep(crashOnce(step, nil))
		_, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
		require.ErrorIs(t, err, errCrash)
		e.l.SetAfterStep(nil)
		rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		// The wakeup is the mark (issue 30): a report stopped after its
		// wakeup is woken already; one stopped before it is claimed.
		want := protocol.StateClaimed
		if step == ledger.StepWoken {
			want = protocol.StateWoken
		}
		require.Equal(t, want, rec.State, "stuck after %s", step)

		out, err := e.l.Resume(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		assertExactlyOneReport(t, e, c, out)
		require.Equal(t, protocol.StatusSuccess, out.Status)
	}
	_, err := e.l.Resume(ctx, project, "turn-resume", "nope")
	require.ErrorIs(t, err, protocol.ErrUnknownCall)
}
