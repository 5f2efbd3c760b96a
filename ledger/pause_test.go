package ledger_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// registerPlain registers tool with no approval.
func registerPlain(t *testing.T, l *ledger.Ledger, tool string) {
	t.Helper()
	_, err := l.RegisterToolYAML(ctxT(t), project, []byte(fmt.Sprintf(
		"tool_name: %s\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.%s\nafter_execution: suspend\n", tool, tool)))
	require.NoError(t, err)
}

func pauseReq(tool string) protocol.ToolPauseRequest {
	return protocol.ToolPauseRequest{ProjectID: project, ToolName: tool, Reason: "upstream outage"}
}

// commandsOf returns the commands stored on tool's subject, in stream order.
func commandsOf(t *testing.T, e *env, tool string) []*nats.Msg {
	t.Helper()
	return e.subjectEntries(t, protocol.ToolCommandSubject("v1", project, channel, tool))
}

func commandDeadline(t *testing.T, m *nats.Msg) int64 {
	t.Helper()
	var p protocol.ToolCommandPayload
	require.NoError(t, json.Unmarshal(m.Data, &p))
	return p.DeadlineUnixMS
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name, label, value string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					if m.GetGauge() != nil {
						return m.GetGauge().GetValue(), true
					}
					return m.GetCounter().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// TestPauseHoldsAndResumeReleasesInDispatchOrder: while a tool is paused
// its dispatches are held (a held entry with reason paused, state paused,
// the deadline fixed at dispatch, no command; a repeat answers the same;
// a tool's report is refused); resume publishes their commands in
// dispatch order, each with its original deadline, and later dispatches
// publish at once.
func TestPauseHoldsAndResumeReleasesInDispatchOrder(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerPlain(t, l, "wire")
	before, req := deadlineCall("turn-p", "c0", "wire", 120_000)
	_, err := l.Dispatch(ctx, req)
	require.NoError(t, err)

	p, err := l.PauseTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	require.True(t, p.Paused)
	pe := e.subjectEntries(t, protocol.PauseSubject("v1", project, "wire"))
	require.Len(t, pe, 1)
	require.Equal(t, string(protocol.KindToolPause), pe[0].Header.Get(protocol.HeaderEntryKind))
	require.Equal(t, "ops", pe[0].Header.Get(protocol.HeaderActor))
	var entry protocol.ToolPauseEntry
	require.NoError(t, json.Unmarshal(pe[0].Data, &entry))
	require.Equal(t, protocol.ToolPauseEntry{ProjectID: project, ToolName: "wire", Paused: true, Actor: "ops", Reason: "upstream outage"}, entry)
	v, ok := gaugeValue(t, reg, "cgledger_tool_paused", "tool", "wire")
	require.True(t, ok)
	require.Equal(t, 1.0, v)

	var calls []call
	deadlines := map[string]int64{}
	for i := 1; i <= 3; i++ {
		c, req := deadlineCall("turn-p", fmt.Sprintf("c%d", i), "wire", 120_000)
		res, err := l.Dispatch(ctx, req)
		require.NoError(t, err)
		require.True(t, res.Paused)
		require.Zero(t, res.CommandSeq)
		require.InDelta(t, time.Now().Add(2*time.Minute).UnixMilli(), res.DeadlineUnixMS, float64(time.Minute.Milliseconds()), "the deadline is fixed at dispatch")
		again, err := l.Dispatch(ctx, req)
		require.NoError(t, err)
		require.True(t, again.Duplicate)
		require.True(t, again.Paused)
		require.Equal(t, res.DeadlineUnixMS, again.DeadlineUnixMS)
		rec, err := l.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, protocol.StatePaused, rec.State)
		held := e.subjectEntries(t, protocol.HeldSubject("v1", project, channel, c.turn, c.id))
		require.Len(t, held, 1)
		var he protocol.HeldEntry
		require.NoError(t, json.Unmarshal(held[0].Data, &he))
		require.Equal(t, protocol.HeldPaused, he.Reason)
		require.Equal(t, res.DeadlineUnixMS, he.DeadlineUnixMS)
		require.Equal(t, p.Seq, he.PauseSeq)
		calls = append(calls, c)
		deadlines[c.id] = res.DeadlineUnixMS
	}
	cmds := commandsOf(t, e, "wire")
	require.Len(t, cmds, 1, "only the command dispatched before the pause")
	require.Equal(t, before.id, cmds[0].Header.Get(protocol.HeaderToolCallID))

	rc := calls[0].resultCard(protocol.StatusSuccess)
	rc.AuthorID, rc.FunctionName = "tool.wire", "wire"
	_, err = l.PutCard(ctx, rc)
	require.NoError(t, err)
	rep := calls[0].reportReq(protocol.StatusSuccess, rc.CardID)
	rep.SourceID, rep.SourceFunction = "tool.wire", "wire"
	_, err = l.Report(ctx, rep)
	requireRefusal(t, err, protocol.CodeConflict)

	// The worker cancels a held call: recorded, as for a dispatched call
	// (its tool's service finds the cancel once the resume publishes it).
	cr, err := l.Cancel(ctx, protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: calls[2].turn, ToolCallID: calls[2].id, Reason: "not needed"})
	require.NoError(t, err)
	require.NotZero(t, cr.Seq)

	r, err := l.ResumeTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	require.False(t, r.Paused)
	require.Equal(t, 3, r.Released)
	v, _ = gaugeValue(t, reg, "cgledger_tool_paused", "tool", "wire")
	require.Equal(t, 0.0, v)
	cmds = commandsOf(t, e, "wire")
	require.Len(t, cmds, 4)
	for i, c := range calls {
		m := cmds[i+1]
		require.Equal(t, c.id, m.Header.Get(protocol.HeaderToolCallID), "released in dispatch order")
		require.Equal(t, deadlines[c.id], commandDeadline(t, m), "with the deadline fixed at dispatch")
		require.Equal(t, protocol.IdempotencyKey(project, c.turn, c.id), m.Header.Get(protocol.HeaderIdempotencyKey))
		rec, err := l.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, protocol.StateDispatched, rec.State)
		require.NotZero(t, rec.CommandSeq)
	}
	_, err = l.Report(ctx, rep)
	require.NoError(t, err, "released, its tool's report is accepted")

	after, req := deadlineCall("turn-p", "c9", "wire", 120_000)
	res, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.False(t, res.Paused)
	require.NotZero(t, res.CommandSeq)
	require.Len(t, callEntries(t, e, protocol.ToolCommandSubject("v1", project, channel, "wire"), after), 1)
	ok1, _ := gaugeValue(t, reg, "cgledger_operator_actions_total", "action", protocol.OpToolPause)
	ok2, _ := gaugeValue(t, reg, "cgledger_operator_actions_total", "action", protocol.OpToolResume)
	require.Equal(t, 1.0, ok1)
	require.Equal(t, 1.0, ok2)
}

// TestPauseDeadlinePassesWhileHeld: a held call whose deadline passes
// while its tool is paused ends timeout by the deadline keeper, and the
// resume does not release it.
func TestPauseDeadlinePassesWhileHeld(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerPlain(t, l, "wire")
	startKeeper(t, l, 5*time.Second)
	_, err := l.PauseTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	c, req := deadlineCall("turn-d", "c1", "wire", 1000)
	res, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, res.Paused)

	requireLedgerTimeout(t, e, l, c)
	rec, err := l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, res.DeadlineUnixMS, rec.DeadlineUnixMS)
	r, err := l.ResumeTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	require.Zero(t, r.Released)
	require.Empty(t, commandsOf(t, e, "wire"), "a call that ended while paused is not released")
}

// TestPauseRacesDispatchesThroughAnotherLedger: a pause through one ledger
// racing dispatches through another: no command is stored after the
// pause entry (each command append expects the pause state its dispatch
// read), and every dispatch is either published before the pause or held.
func TestPauseRacesDispatchesThroughAnotherLedger(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	l2, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerPlain(t, l1, "wire")
	// l2 has read the tool running: its first guess is stale once paused.
	warm, req := deadlineCall("turn-r", "warm", "wire", 120_000)
	_, err := l2.Dispatch(ctx, req)
	require.NoError(t, err)

	const n = 24
	results := make([]protocol.DispatchResult, n)
	calls := make([]call, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	// The pause goes in once a few dispatches are answered, the others
	// still in flight (or not started: a few workers take them in turn).
	answered := make(chan struct{}, n)
	work := make(chan int)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range work {
				_, req := deadlineCall("turn-r", fmt.Sprintf("c%d", i), "wire", 120_000)
				res, err := l2.Dispatch(ctx, req)
				require.NoError(t, err)
				results[i] = res
				answered <- struct{}{}
			}
		}()
	}
	for i := range n {
		calls[i], _ = deadlineCall("turn-r", fmt.Sprintf("c%d", i), "wire", 120_000)
	}
	close(start)
	paused := make(chan struct{})
	go func() {
		for i := range n {
			if i == 12 {
				// The rest after the pause: held for sure, through l2's
				// stale first guess (running).
				<-paused
			}
			work <- i
		}
		close(work)
	}()
	for range 6 {
		<-answered
	}
	p, err := l1.PauseTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	close(paused)
	wg.Wait()

	cmds := commandsOf(t, e, "wire")
	published := map[string]bool{}
	for _, m := range cmds {
		meta, err := m.Metadata()
		require.NoError(t, err)
		require.Less(t, meta.Sequence.Stream, p.Seq, "no command after the pause entry (call %s)", m.Header.Get(protocol.HeaderToolCallID))
		published[m.Header.Get(protocol.HeaderToolCallID)] = true
	}
	require.True(t, published[warm.id])
	held := 0
	for i, c := range calls {
		rec, err := l1.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		if published[c.id] {
			require.False(t, results[i].Paused)
			require.Equal(t, protocol.StateDispatched, rec.State)
			continue
		}
		held++
		require.True(t, results[i].Paused, "call %s: neither published nor held", c.id)
		require.Equal(t, protocol.StatePaused, rec.State)
	}
	t.Logf("%d of %d dispatches held", held, n)
	require.Less(t, held, n, "the dispatches answered before the pause published")
	require.Positive(t, held, "the dispatches after the pause are held")

	r, err := l2.ResumeTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	require.Equal(t, held, r.Released)
	require.Len(t, commandsOf(t, e, "wire"), n+1, "every call has its one command")
}

// TestPauseRefusals: a pause of a paused tool, a resume of a running one
// and an unknown tool are refused (and recorded); a malformed body lists
// every violation.
func TestPauseRefusals(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerPlain(t, l, "wire")

	_, err := l.ResumeTool(ctx, "ops", pauseReq("wire"))
	requireRefusal(t, err, protocol.CodeConflict)
	_, err = l.PauseTool(ctx, "ops", pauseReq("nosuch"))
	e1 := requireRefusal(t, err, protocol.CodeNotFound)
	require.Equal(t, "body.tool_name", e1.Violations[0].Field)
	_, err = l.PauseTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	_, err = l.PauseTool(ctx, "ops2", pauseReq("wire"))
	e2 := requireRefusal(t, err, protocol.CodeConflict)
	require.Contains(t, e2.Violations[0].Message, "paused since seq")
	require.Contains(t, e2.Violations[0].Message, "ops")
	require.Len(t, e.subjectEntries(t, protocol.PauseSubject("v1", project, "wire")), 1, "refusals store no pause entry")

	_, err = l.ToolPauseOp(ctx, protocol.OpToolPause, "ops", []byte(`{"tool_name":"bad name","reason":"`+strings.Repeat("x", 1025)+`","extra":1}`))
	e3 := requireRefusal(t, err, protocol.CodeBadRequest)
	fields := map[string]bool{}
	for _, v := range e3.Violations {
		fields[v.Field] = true
	}
	require.Equal(t, map[string]bool{"body.project_id": true, "body.tool_name": true, "body.reason": true, "body.extra": true}, fields)
	_, err = l.ToolPauseOp(ctx, protocol.OpToolResume, "ops", []byte(`{"project_id":"`+project+`","tool_name":"wire"}`))
	e4 := requireRefusal(t, err, protocol.CodeBadRequest)
	require.Equal(t, "body.reason", e4.Violations[0].Field, "the reason is required")
	require.Positive(t, operatorActions(t, reg, protocol.OpToolResume, "refused"))
	rejections := e.subjectEntries(t, protocol.RejectionSubject("v1", project, protocol.Unrouted, protocol.CodeConflict))
	require.NotEmpty(t, rejections, "the refusal is recorded")
}

// TestResumeCutShortIsFinished: a resume cut after releasing one call is
// finished by the resume retried (refused conflict: the tool runs), and by
// the deadline keeper of another ledger; in dispatch order, each call
// once.
func TestResumeCutShortIsFinished(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	l2, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerPlain(t, l1, "wire")
	crash := errors.New("killed")
	cutAfterFirst := func() {
		l1.SetAfterStep(func(s ledger.Step) error {
			if s == ledger.StepResumeReleased {
				return crash
			}
			return nil
		})
	}
	held := func(turn string, k int) []call {
		_, err := l1.PauseTool(ctx, "ops", pauseReq("wire"))
		require.NoError(t, err)
		var cs []call
		for i := range k {
			c, req := deadlineCall(turn, fmt.Sprintf("c%d", i), "wire", 120_000)
			res, err := l1.Dispatch(ctx, req)
			require.NoError(t, err)
			require.True(t, res.Paused)
			cs = append(cs, c)
		}
		return cs
	}
	requireReleased := func(cs []call, offset int) {
		cmds := commandsOf(t, e, "wire")
		require.Len(t, cmds, offset+len(cs), "each call once")
		for i, c := range cs {
			require.Equal(t, c.id, cmds[offset+i].Header.Get(protocol.HeaderToolCallID), "in dispatch order")
			require.Equal(t, c.turn, cmds[offset+i].Header.Get(protocol.HeaderAgentTurnID))
		}
	}

	first := held("turn-x", 3)
	cutAfterFirst()
	_, err := l1.ResumeTool(ctx, "ops", pauseReq("wire"))
	require.ErrorIs(t, err, crash)
	require.Len(t, commandsOf(t, e, "wire"), 1, "cut after the first release")
	l1.SetAfterStep(func(ledger.Step) error { return nil })
	_, err = l2.ResumeTool(ctx, "ops", pauseReq("wire"))
	requireRefusal(t, err, protocol.CodeConflict)
	requireReleased(first, 0)

	second := held("turn-y", 3)
	cutAfterFirst()
	_, err = l1.ResumeTool(ctx, "ops", pauseReq("wire"))
	require.ErrorIs(t, err, crash)
	startKeeper(t, l2, 5*time.Second)
	require.Eventually(t, func() bool { return len(commandsOf(t, e, "wire")) == 6 }, time.Minute, 50*time.Millisecond, "the keeper finishes the resume")
	requireReleased(second, 3)
	for _, c := range second {
		require.Eventually(t, func() bool {
			r, err := l2.GetCall(ctx, project, c.turn, c.id)
			return err == nil && r.State == protocol.StateDispatched && r.CommandSeq != 0
		}, time.Minute, 20*time.Millisecond)
	}
}

// TestPauseHoldsAnApprovedCall: a call needing approval whose tool is
// paused is held for approval first, then, approved, held by the pause
// (its deadline fixed at the decision) until the resume publishes it.
func TestPauseHoldsAnApprovedCall(t *testing.T) {
	e := newEnv(t)
	l, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerGated(t, l, "wire", 3_600_000, "")
	_, err := l.PauseTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	c, req := deadlineCall("turn-a", "c1", "wire", 120_000)
	res, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, res.AwaitingApproval, "held for approval first")
	require.False(t, res.Paused)

	a, err := l.Approve(ctx, "alice", approvalOf(c))
	require.NoError(t, err)
	require.Zero(t, a.CommandSeq, "approved while paused: no command")
	require.NotZero(t, a.DeadlineUnixMS)
	rec, err := l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StatePaused, rec.State)
	require.Equal(t, a.DeadlineUnixMS, rec.DeadlineUnixMS)
	require.Empty(t, commandsOf(t, e, "wire"))
	held := e.subjectEntries(t, protocol.HeldSubject("v1", project, channel, c.turn, c.id))
	require.Len(t, held, 2, "the approval's hold, then the pause's")
	var he protocol.HeldEntry
	require.NoError(t, json.Unmarshal(held[1].Data, &he))
	require.Equal(t, protocol.HeldPaused, he.Reason)
	dup, err := l.Dispatch(ctx, req)
	require.NoError(t, err)
	require.True(t, dup.Paused)

	r, err := l.ResumeTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	require.Equal(t, 1, r.Released)
	cmds := commandsOf(t, e, "wire")
	require.Len(t, cmds, 1)
	require.Equal(t, a.DeadlineUnixMS, commandDeadline(t, cmds[0]), "the deadline fixed at the decision")
	rec, err = l.GetCall(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StateDispatched, rec.State)
}

// TestPauseHoldCutBeforeTheRecord: a dispatch cut after its held entry,
// before its record says paused: a repeat answers it held, and a resume
// releases it (from the held entry) even if nobody repeated it.
func TestPauseHoldCutBeforeTheRecord(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	l2, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerPlain(t, l1, "wire")
	_, err := l1.PauseTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	crash := errors.New("killed")
	l1.SetAfterStep(func(s ledger.Step) error {
		if s == ledger.StepPauseHeld {
			return crash
		}
		return nil
	})
	repeated, req1 := deadlineCall("turn-h", "c1", "wire", 120_000)
	_, err = l1.Dispatch(ctx, req1)
	require.ErrorIs(t, err, crash)
	alone, req2 := deadlineCall("turn-h", "c2", "wire", 120_000)
	_, err = l1.Dispatch(ctx, req2)
	require.ErrorIs(t, err, crash)
	for _, c := range []call{repeated, alone} {
		require.Len(t, e.subjectEntries(t, protocol.HeldSubject("v1", project, channel, c.turn, c.id)), 1, "the hold is stored")
		rec, err := l2.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, protocol.StateDispatched, rec.State, "the record was not moved")
	}
	again, err := l2.Dispatch(ctx, req1)
	require.NoError(t, err)
	require.True(t, again.Paused, "the repeat finds the hold and finishes it")
	rec, err := l2.GetCall(ctx, project, repeated.turn, repeated.id)
	require.NoError(t, err)
	require.Equal(t, protocol.StatePaused, rec.State)
	require.Len(t, e.subjectEntries(t, protocol.HeldSubject("v1", project, channel, repeated.turn, repeated.id)), 1, "one hold")

	r, err := l2.ResumeTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	require.Equal(t, 2, r.Released)
	cmds := commandsOf(t, e, "wire")
	require.Len(t, cmds, 2)
	require.Equal(t, repeated.id, cmds[0].Header.Get(protocol.HeaderToolCallID), "in dispatch order")
	require.Equal(t, alone.id, cmds[1].Header.Get(protocol.HeaderToolCallID))
	for _, c := range []call{repeated, alone} {
		rec, err := l2.GetCall(ctx, project, c.turn, c.id)
		require.NoError(t, err)
		require.Equal(t, protocol.StateDispatched, rec.State)
		require.NotZero(t, rec.CommandSeq)
	}
}

// TestResumeCutShortIsFinishedBeforeANewDispatch: a resume cut after its
// first release (its process died) leaves calls held while the tool runs;
// the next dispatch of the tool, through another ledger, finishes that
// release before publishing its own command, so no new call overtakes the
// held ones and none waits for the keeper.
func TestResumeCutShortIsFinishedBeforeANewDispatch(t *testing.T) {
	e := newEnv(t)
	l1, _ := openLedger(t, e.srv)
	l2, _ := openLedger(t, e.srv)
	ctx := ctxT(t)
	registerPlain(t, l1, "wire")
	_, err := l1.PauseTool(ctx, "ops", pauseReq("wire"))
	require.NoError(t, err)
	var held []call
	for i := range 3 {
		c, req := deadlineCall("turn-h", fmt.Sprintf("c%d", i), "wire", 120_000)
		res, err := l1.Dispatch(ctx, req)
		require.NoError(t, err)
		require.True(t, res.Paused)
		held = append(held, c)
	}
	crash := errors.New("killed")
	l1.SetAfterStep(func(s ledger.Step) error {
		if s == ledger.StepResumeReleased {
			return crash
		}
		return nil
	})
	_, err = l1.ResumeTool(ctx, "ops", pauseReq("wire"))
	require.ErrorIs(t, err, crash)
	require.Len(t, commandsOf(t, e, "wire"), 1, "cut after the first release")

	fresh, req := deadlineCall("turn-n", "n0", "wire", 120_000)
	res, err := l2.Dispatch(ctx, req)
	require.NoError(t, err)
	require.False(t, res.Paused)
	cmds := commandsOf(t, e, "wire")
	require.Len(t, cmds, 4, "the held calls and the new one, each once")
	for i, c := range append(held, fresh) {
		require.Equal(t, c.id, cmds[i].Header.Get(protocol.HeaderToolCallID), "the held calls first, in dispatch order")
		require.Equal(t, c.turn, cmds[i].Header.Get(protocol.HeaderAgentTurnID))
	}
}
