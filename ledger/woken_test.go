package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
	"github.com/nats-io/nats.go/jetstream"
)

// Issue 30: the wakeup entry is the mark that a report is finished. These
// tests hold the report path to it with no record written after dispatch.

// wokenLease is the report lease of the ledgers these tests open, so a
// crashed report can be taken over without a long wait.
const wokenLease = 100 * time.Millisecond

// wokenOpen opens a ledger process with the short lease.
func wokenOpen(t *testing.T, e *env) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(ctxT(t), e.srv.Connect(t), ledger.Config{ReportLease: wokenLease})
	require.NoError(t, err)
	t.Cleanup(l.Close)
	return l
}

// wakeupEntries are the stored result wakeups of c (any worker target).
func wakeupEntries(t *testing.T, e *env, c call) []protocol.WakeupEntry {
	t.Helper()
	var out []protocol.WakeupEntry
	for _, m := range e.subjectEntries(t, protocol.ChannelWakeupsFilter("v1", project, channel)) {
		if m.Header.Get(protocol.HeaderToolCallID) != c.id || m.Header.Get(protocol.HeaderAgentTurnID) != c.turn {
			continue
		}
		var w protocol.WakeupEntry
		require.NoError(t, json.Unmarshal(m.Data, &w))
		if w.Phase == "" {
			out = append(out, w)
		}
	}
	return out
}

// crashAfterAppend reports c through l, which stops after the append (as if
// killed): the report is stored, its wakeup is not.
func crashAfterAppend(t *testing.T, l *ledger.Ledger, c call, cardID string) {
	t.Helper()
	l.SetAfterStep(crashOnce(ledger.StepAppended, nil))
	_, err := l.Report(ctxT(t), c.reportReq(protocol.StatusSuccess, cardID))
	require.ErrorIs(t, err, errCrash)
	l.SetAfterStep(nil)
}

// TestWokenSweepAtStartFinishesCrashAfterAppend: a report whose process
// stopped after the append, and that nobody retries, is finished by the
// sweep a (re)started process runs at start: exactly one wakeup, stored and
// delivered, and call.get then shows the call woken with its sequence.
func TestWokenSweepAtStartFinishesCrashAfterAppend(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w-sweep"})
	require.NoError(t, err)
	sub, err := e.nc.SubscribeSync(protocol.WakeupSubject("v1", project, channel, "w-sweep"))
	require.NoError(t, err)
	c := newCall("turn-sweep-start", "call-1", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	crashAfterAppend(t, e.l, c, rc.CardID)
	rec, err := e.l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateClaimed, rec.State, "stored, not woken")
	require.Empty(t, wakeupEntries(t, e, c))

	restarted := wokenOpen(t, e)
	sw, err := restarted.StartSweeper(ctx, ledger.SweepConfig{Interval: 50 * time.Millisecond})
	require.NoError(t, err)
	defer func() { require.NoError(t, sw.Stop(ctx)) }()
	hpWaitFor(t, "the sweep to wake the agent", func() bool {
		r, err := restarted.GetCall(ctx, project, c.turn, c.id)
		return err == nil && r.State == protocol.StateWoken
	})
	ws := wakeupEntries(t, e, c)
	require.Len(t, ws, 1, "exactly one wakeup")
	rec = hpStreamView(t, e, c)
	require.Equal(t, protocol.StateWoken, rec.State)
	require.NotZero(t, rec.Claim.WakeupSeq)
	require.Equal(t, ws[0].ReportSeq, rec.Claim.Seq)
	require.Equal(t, map[string]int{c.id: 1}, drainWakeups(t, e.nc, sub), "one wakeup delivered")
	// Later sweeps find it settled: no second wakeup.
	res, err := restarted.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Finished)
	require.Len(t, wakeupEntries(t, e, c), 1)
	// The retry that never came, now: a duplicate with the swept wakeup.
	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.True(t, out.Duplicate)
	require.Equal(t, rec.Claim.WakeupSeq, out.Wakeup.Seq)
}

// TestWokenDuplicateReadsWakeupSeqFromStream: the record in the bucket is
// never marked; a duplicate through a process that never saw the call (no
// memory of it) answers the original outcome with the wakeup's sequence,
// read from the stream, at once (no lease to wait out) and without writing.
func TestWokenDuplicateReadsWakeupSeqFromStream(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	other, err := ledger.Open(ctx, e.srv.Connect(t), ledger.Config{ReportLease: time.Hour})
	require.NoError(t, err)
	defer other.Close()

	// No roster entry yet: the wakeup skipped is found by its own subject.
	c0 := newCall("turn-woken-dup", "call-0", 1)
	rc0 := e.dispatchAndResult(t, c0, protocol.StatusSuccess)
	orig0, err := e.l.Report(ctx, c0.reportReq(protocol.StatusSuccess, rc0.CardID))
	require.NoError(t, err)
	require.True(t, orig0.Wakeup.Skipped)
	dup0, err := other.Report(ctx, c0.reportReq(protocol.StatusSuccess, rc0.CardID))
	require.NoError(t, err)
	require.True(t, dup0.Duplicate)
	require.Equal(t, orig0.Wakeup, dup0.Wakeup)

	_, err = e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w-dup"})
	require.NoError(t, err)
	c := newCall("turn-woken-dup", "call-1", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	orig, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.NotZero(t, orig.Wakeup.Seq)
	require.Equal(t, protocol.StateDispatched, hpRecordState(t, hpKV(t, e.nc), c))
	dup, err := other.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, orig.Seq, dup.Seq)
	require.Equal(t, orig.Wakeup, dup.Wakeup)
	require.Len(t, wakeupEntries(t, e, c), 1)
	require.Equal(t, protocol.StateDispatched, hpRecordState(t, hpKV(t, e.nc), c), "a duplicate writes no record")
}

// TestWokenSweepsRacingGiveOneWakeup: three processes sweep one ledger at
// once over reports whose writer stopped after the append: each report
// gets exactly one wakeup (stored and delivered), the takeover's
// compare-and-set deciding who publishes it.
func TestWokenSweepsRacingGiveOneWakeup(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w-race"})
	require.NoError(t, err)
	sub, err := e.nc.SubscribeSync(protocol.WakeupSubject("v1", project, channel, "w-race"))
	require.NoError(t, err)
	calls := make([]call, 8)
	for i := range calls {
		calls[i] = newCall("turn-sweep-race", fmt.Sprintf("call-%d", i), 1)
		rc := e.dispatchAndResult(t, calls[i], protocol.StatusSuccess)
		crashAfterAppend(t, e.l, calls[i], rc.CardID)
	}
	sweepers := []*ledger.Ledger{wokenOpen(t, e), wokenOpen(t, e), wokenOpen(t, e)}
	require.Equal(t, len(calls), sweepConcurrently(t, ctx, sweepers, len(calls)), "one takeover per report")
	got := drainWakeups(t, e.nc, sub)
	for _, c := range calls {
		require.Len(t, wakeupEntries(t, e, c), 1, c.id)
		require.Equal(t, 1, got[c.id], "%s: one wakeup delivered", c.id)
		rec := hpStreamView(t, e, c)
		require.Equal(t, protocol.StateWoken, rec.State, c.id)
	}
	// Nothing is left to finish; a report one racing sweep saw taken over
	// by another (unsettled then) may keep the watermark behind it until
	// the next sweep, which moves it past: then a sweep reads nothing.
	res, err := sweepers[0].Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Finished)
	res, err = sweepers[0].Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Reports)
}

// TestWokenCallGetShowsWakeupSeq: call.get over the API, through a process
// that never saw the call, shows it woken with the wakeup's sequence once
// the wakeup is stored, and claimed (the report's outcome, no wakeup)
// while only the report is.
func TestWokenCallGetShowsWakeupSeq(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w-get"})
	require.NoError(t, err)
	c := newCall("turn-woken-get", "call-1", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	rec := hpStreamView(t, e, c)
	require.Equal(t, protocol.StateWoken, rec.State)
	require.Equal(t, out.Seq, rec.Claim.Seq)
	require.Equal(t, out.Wakeup.Seq, rec.Claim.WakeupSeq)
	require.Equal(t, out.Wakeup.Subject, rec.Claim.WakeupSubject)
	require.Equal(t, "w-get", rec.Claim.WorkerTarget)

	// call.get over the API of a process that never saw the call: woken,
	// and the dispatch's sequences, read from the stream.
	fresh := wokenOpen(t, e)
	api, err := fresh.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	defer api.Stop()
	d, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	require.True(t, d.Duplicate)
	r := request(t, e.srv.Connect(t), protocol.APISubject(project, agent, protocol.OpCallGet), nil,
		fmt.Sprintf(`{"project_id":%q,"agent_turn_id":%q,"tool_call_id":%q}`, project, c.turn, c.id))
	require.True(t, r.OK, "%+v", r.Error)
	var view protocol.CallRecord
	require.NoError(t, json.Unmarshal(r.Result, &view))
	require.Equal(t, protocol.StateWoken, view.State)
	require.Equal(t, out.Wakeup.Seq, view.Claim.WakeupSeq)
	require.Equal(t, d.CardSeq, view.CardSeq)
	require.Equal(t, d.CommandSeq, view.CommandSeq)

	c2 := newCall("turn-woken-get", "call-2", 1)
	rc2 := e.dispatchAndResult(t, c2, protocol.StatusSuccess)
	crashAfterAppend(t, e.l, c2, rc2.CardID)
	rec = hpStreamView(t, e, c2)
	require.Equal(t, protocol.StateClaimed, rec.State)
	require.Zero(t, rec.Claim.WakeupSeq)
}

// assertNoErr reports err from a goroutine (require stops only the test's
// own goroutine).
func assertNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil && err != context.Canceled {
		t.Errorf("unexpected error: %v", err)
	}
}

// TestWokenSweepLeavesFinishedReportsAlone: reports answered normally
// (their wakeup, or wakeup_skipped, stored) are settled for the sweep: it
// finishes none of them, replays nothing, and moves its watermark past them.
func TestWokenSweepLeavesFinishedReportsAlone(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	for i := range 6 {
		if i == 3 {
			_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w-settled"})
			require.NoError(t, err)
		}
		c := newCall("turn-settled", fmt.Sprintf("call-%d", i), 1)
		rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
		_, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
		require.NoError(t, err)
	}
	sweeper := wokenOpen(t, e)
	reports := 0
	hpWaitFor(t, "a sweep with nothing pending", func() bool {
		res, err := sweeper.Sweep(ctx)
		require.NoError(t, err)
		require.Zero(t, res.Finished, "no finished report is taken over")
		reports += res.Reports
		return res.Pending == 0 && res.Watermark == res.To
	})
	require.GreaterOrEqual(t, reports, 6)
	for i := range 6 {
		c := newCall("turn-settled", fmt.Sprintf("call-%d", i), 1)
		require.Len(t, e.subjectEntries(t, protocol.DuplicateSubject("v1", project, channel, c.turn, c.id)), 0, "no replay recorded")
	}
}

// TestWokenOneBucketWritePerCall: a call's path (dispatch, result card,
// report, duplicate report, consume) writes the call-record bucket once,
// the dispatch's create: the woken mark and the sequences' write are gone
// (issue 30), so the bucket's stream holds one message per call.
func TestWokenOneBucketWritePerCall(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w-writes"})
	require.NoError(t, err)
	js, err := jetstream.New(e.nc)
	require.NoError(t, err)
	bucket, err := js.Stream(ctx, "KV_"+stream.DefaultBucket)
	require.NoError(t, err)
	before, err := bucket.Info(ctx)
	require.NoError(t, err)
	const n = 20
	for i := range n {
		c := newCall("turn-writes", fmt.Sprintf("call-%d", i), 1)
		rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
		_, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
		require.NoError(t, err)
		dup, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
		require.NoError(t, err)
		require.True(t, dup.Duplicate)
		_, err = e.l.Consume(ctx, protocol.ConsumeRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id})
		require.NoError(t, err)
	}
	e.l.Flush()
	after, err := bucket.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, n, after.State.LastSeq-before.State.LastSeq, "one bucket write per call")
}

// TestWokenClusterSweepsRacingGiveOneWakeup: the racing sweeps on an R3
// ledger, three processes on three nodes (no direct gets: the reads go to
// the stream's leader). Reports whose writer stopped after the append get
// one wakeup each, and a duplicate through another node then reads it.
func TestWokenClusterSweepsRacingGiveOneWakeup(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	var ls []*ledger.Ledger
	for i := range c.Size() {
		l, err := ledger.Open(ctxT(t), c.Connect(t, i), ledger.Config{Streams: stream.Config{Replicas: 3}, ReportLease: wokenLease})
		require.NoError(t, err)
		t.Cleanup(l.Close)
		ls = append(ls, l)
	}
	ctx := ctxT(t)
	_, err := ls[0].SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w-cluster"})
	require.NoError(t, err)
	calls := make([]call, 4)
	cards := make([]string, len(calls))
	for i := range calls {
		calls[i] = newCall("turn-cluster-sweep", fmt.Sprintf("call-%d", i), 1)
		_, err := ls[0].Dispatch(ctx, calls[i].dispatchReq())
		require.NoError(t, err)
		rc := calls[i].resultCard(protocol.StatusSuccess)
		_, err = ls[0].PutCard(ctx, rc)
		require.NoError(t, err)
		cards[i] = rc.CardID
		crashAfterAppend(t, ls[0], calls[i], rc.CardID)
	}
	require.Equal(t, len(calls), sweepConcurrently(t, ctx, ls, len(calls)), "one takeover per report")
	for i, cl := range calls {
		rec, err := ls[2].GetCall(ctx, project, cl.turn, cl.id)
		require.NoError(t, err)
		require.Equal(t, protocol.StateWoken, rec.State, cl.id)
		out, err := ls[1].Report(ctx, cl.reportReq(protocol.StatusSuccess, cards[i]))
		require.NoError(t, err)
		require.True(t, out.Duplicate)
		require.Equal(t, rec.Claim.WakeupSeq, out.Wakeup.Seq, cl.id)
	}
}

// sweepConcurrently runs a sweep in each ledger at once, round after round,
// until they have finished want reports between them, and returns how many
// they finished.
func sweepConcurrently(t *testing.T, ctx context.Context, ls []*ledger.Ledger, want int) int {
	t.Helper()
	finished := 0
	hpWaitFor(t, "the sweeps to finish every report", func() bool {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, l := range ls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := l.Sweep(ctx)
				assertNoErr(t, err)
				mu.Lock()
				finished += res.Finished
				mu.Unlock()
			}()
		}
		wg.Wait()
		return finished >= want
	})
	return finished
}

// TestWokenTakeoverOutlivingItsLeaseIsNotCounted: a sweep's takeover that
// stalls past its lease after locking lets another sweep take over and
// publish the wakeup; the stalled one's wakeup is then the stream's
// duplicate. One wakeup is stored, and only the sweep that stored it
// counts the report finished.
func TestWokenTakeoverOutlivingItsLeaseIsNotCounted(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w-stall"})
	require.NoError(t, err)
	c := newCall("turn-sweep-stall", "call-1", 1)
	rc := e.dispatchAndResult(t, c, protocol.StatusSuccess)
	crashAfterAppend(t, e.l, c, rc.CardID)

	stalled, other := wokenOpen(t, e), wokenOpen(t, e)
	locked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stalled.SetAfterStep(func(s ledger.Step) error {
		if s == ledger.StepMarkedWoken {
			once.Do(func() {
				close(locked)
				<-release
			})
		}
		return nil
	})
	type result struct {
		res ledger.SweepResult
		err error
	}
	first := make(chan result, 1)
	go func() {
		// Sweeps leave the report alone until it is older than the lease;
		// the first sweep after that locks it and stalls.
		for {
			res, err := stalled.Sweep(ctx)
			select {
			case <-locked:
			default:
				if err == nil {
					continue
				}
			}
			first <- result{res, err}
			return
		}
	}()
	select {
	case <-locked:
	case r := <-first:
		t.Fatalf("the first sweep ended without locking the takeover: %v", r.err)
	case <-ctx.Done():
		t.Fatal("the first sweep never locked the takeover")
	}
	// The other sweep waits out the stalled takeover's lease, then takes
	// over and publishes the wakeup.
	res, err := other.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Finished, "the other sweep stored the wakeup")
	close(release)
	var r result
	select {
	case r = <-first:
	case <-ctx.Done():
		t.Fatal("the stalled sweep never ended")
	}
	require.NoError(t, r.err)
	require.Zero(t, r.res.Finished, "the stalled sweep's wakeup was a duplicate")
	require.Len(t, wakeupEntries(t, e, c), 1, "one wakeup stored")
}
