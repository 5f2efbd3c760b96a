package ledger_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// prepareCall dispatches c and prepares it as its tool would, with token
// and a commit deadline in.
func prepareCall(t *testing.T, l *ledger.Ledger, c call, token string, in time.Duration) protocol.PrepareResult {
	t.Helper()
	ctx := ctxT(t)
	_, err := l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	res, err := l.Prepare(ctx, protocol.PrepareRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id,
		CommitToken: token, CommitDeadlineUnixMS: time.Now().Add(in).UnixMilli()})
	require.NoError(t, err)
	return res
}

func decisionReq(c call, token string) protocol.DecisionRequest {
	return protocol.DecisionRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id, CommitToken: token}
}

// requireRefused checks that err is a refusal with code, recorded (a
// rejection entry), whose first violation has vcode.
func requireRefused(t *testing.T, err error, code protocol.Code, vcode string) {
	t.Helper()
	pe, ok := protocol.AsError(err)
	require.True(t, ok, "want a refusal, got %v", err)
	require.Equal(t, code, pe.Code, "%v", err)
	require.NotEmpty(t, pe.Violations)
	require.Equal(t, vcode, pe.Violations[0].Code, "%v", err)
	require.NotZero(t, pe.Seq, "the refusal is recorded")
}

func (e *env) decisions(t *testing.T, c call) []protocol.DecisionEntry {
	t.Helper()
	var out []protocol.DecisionEntry
	for _, m := range e.subjectEntries(t, protocol.DecisionSubject("v1", project, channel, "echo", c.turn, c.id)) {
		var d protocol.DecisionEntry
		require.NoError(t, json.Unmarshal(m.Data, &d))
		out = append(out, d)
	}
	return out
}

// TestTwoPhaseCommit: a prepare is recorded and wakes the worker with the
// token; the worker's commit is recorded with its actor and routed to the
// tool's consumer; the tool's final report is the call's one report; the
// consumed token is refused after (commit again, abort), recorded.
func TestTwoPhaseCommit(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	_, err := e.l.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "w1"})
	require.NoError(t, err)
	js, err := jetstream.New(e.nc)
	require.NoError(t, err)
	toolCons, err := js.CreateOrUpdateConsumer(ctx, stream.DefaultName, jetstream.ConsumerConfig{Durable: "echo-2pc",
		FilterSubject: protocol.ToolCommandSubject("v1", project, channel, "echo") + ".>", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)

	c := newCall("turn-2pc", "c1", 1)
	prep := prepareCall(t, e.l, c, "tok-1", 20*time.Second)
	require.NotZero(t, prep.Seq)
	require.NotZero(t, prep.WakeupSeq, "the worker is woken with the prepare")
	wakeups := e.subjectEntries(t, protocol.WakeupSubject("v1", project, channel, "w1"))
	require.Len(t, wakeups, 1)
	var w protocol.WakeupEntry
	require.NoError(t, json.Unmarshal(wakeups[0].Data, &w))
	require.Equal(t, protocol.PhasePrepared, w.Phase)
	require.Equal(t, prep.Seq, w.ReportSeq)

	// A repeated prepare is a duplicate; another token is refused.
	again, err := e.l.Prepare(ctx, protocol.PrepareRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id, CommitToken: "tok-1",
		CommitDeadlineUnixMS: mustTwoPhase(t, e.l, c).CommitDeadlineUnixMS})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	_, err = e.l.Prepare(ctx, protocol.PrepareRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id, CommitToken: "tok-2",
		CommitDeadlineUnixMS: time.Now().Add(time.Second * 20).UnixMilli()})
	requireRefused(t, err, protocol.CodeConflict, protocol.VConflict)
	require.Equal(t, protocol.PhasePrepared, mustTwoPhase(t, e.l, c).State)

	wctx := ledger.WithCaller(ctx, protocol.Caller{Project: project, Actor: agent})
	res, err := e.l.Commit(wctx, decisionReq(c, "tok-1"))
	require.NoError(t, err)
	require.Equal(t, protocol.DecisionCommit, res.Decision)
	ds := e.subjectEntries(t, protocol.DecisionSubject("v1", project, channel, "echo", c.turn, c.id))
	require.Len(t, ds, 1)
	require.Equal(t, agent, ds[0].Header.Get(protocol.HeaderActor), "recorded with the actor")
	tp := mustTwoPhase(t, e.l, c)
	require.Equal(t, protocol.PhaseCommitted, tp.State)
	require.Equal(t, protocol.DecidedByWorker, tp.DecidedBy)

	// The tool's consumer gets the decision (after the command).
	batch, err := toolCons.Fetch(1, jetstream.FetchMaxWait(30*time.Second))
	require.NoError(t, err)
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	require.Len(t, got, 1)
	require.Equal(t, string(protocol.KindDecision), got[0].Headers().Get(protocol.HeaderEntryKind))
	var d protocol.DecisionEntry
	require.NoError(t, json.Unmarshal(got[0].Data(), &d))
	require.Equal(t, protocol.DecisionCommit, d.Decision)
	require.Equal(t, "tok-1", d.CommitToken)

	// Phase 2 done: the tool reports the call's final result.
	rc := c.resultCard(protocol.StatusSuccess)
	_, err = e.l.PutCard(ctx, rc)
	require.NoError(t, err)
	out, err := e.l.Report(ctx, c.reportReq(protocol.StatusSuccess, rc.CardID))
	require.NoError(t, err)
	require.False(t, out.Duplicate)
	require.NoError(t, got[0].Ack())

	_, err = e.l.Commit(wctx, decisionReq(c, "tok-1"))
	requireRefused(t, err, protocol.CodeConflict, protocol.VConflict)
	_, err = e.l.Abort(wctx, decisionReq(c, "tok-1"))
	requireRefused(t, err, protocol.CodeConflict, protocol.VConflict)
	require.Len(t, e.decisions(t, c), 1, "a consumed token is never delivered twice")
	require.Len(t, e.subjectEntries(t, protocol.ReportSubject("v1", project, channel, c.turn, c.id)), 1)
}

func mustTwoPhase(t *testing.T, l *ledger.Ledger, c call) *protocol.TwoPhase {
	t.Helper()
	tp, err := l.TwoPhase(ctxT(t), project, c.turn, c.id)
	require.NoError(t, err)
	require.NotNil(t, tp)
	return tp
}

// TestTwoPhaseAbortAndRefusals: abort is recorded and routed as a
// rollback; commit after abort, a wrong token, another agent, another
// project and a call never prepared are each refused, listed and recorded.
func TestTwoPhaseAbortAndRefusals(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	c := newCall("turn-abort", "c1", 1)
	prepareCall(t, e.l, c, "tok-a", 20*time.Second)

	wrong := decisionReq(c, "tok-b")
	_, err := e.l.Commit(ctx, wrong)
	requireRefused(t, err, protocol.CodeMismatch, protocol.VMismatch)
	other := decisionReq(c, "tok-a")
	other.AgentID = "agent-2"
	_, err = e.l.Commit(ctx, other)
	requireRefused(t, err, protocol.CodeMismatch, protocol.VMismatch)
	foreign := decisionReq(c, "tok-a")
	foreign.ProjectID = "proj-2"
	_, err = e.l.Commit(ctx, foreign)
	requireRefused(t, err, protocol.CodeUnknownCall, protocol.VNotFound)
	require.Empty(t, e.decisions(t, c), "no refused request decides")

	res, err := e.l.Abort(ctx, decisionReq(c, "tok-a"))
	require.NoError(t, err)
	require.Equal(t, protocol.DecisionAbort, res.Decision)
	_, err = e.l.Commit(ctx, decisionReq(c, "tok-a"))
	requireRefused(t, err, protocol.CodeConflict, protocol.VConflict)
	ds := e.decisions(t, c)
	require.Len(t, ds, 1)
	require.Equal(t, protocol.DecisionAbort, ds[0].Decision)
	require.Equal(t, protocol.DecidedByWorker, ds[0].DecidedBy)
	require.Equal(t, protocol.PhaseAborted, mustTwoPhase(t, e.l, c).State)

	plain := newCall("turn-abort", "c2", 1)
	_, err = e.l.Dispatch(ctx, plain.dispatchReq())
	require.NoError(t, err)
	_, err = e.l.Commit(ctx, decisionReq(plain, "tok-a"))
	requireRefused(t, err, protocol.CodeConflict, protocol.VNotFound)

	// Nobody dispatches on a decision's subject: only the ledger writes it.
	forged := newCall("turn-abort", "c4", 1)
	req := forged.dispatchReq()
	req.Subject = protocol.DecisionSubject("v1", project, channel, "echo", c.turn, "c9")
	_, err = e.l.Dispatch(ctx, req)
	requireRefused(t, err, protocol.CodeBadRequest, protocol.VInvalidSubject)

	// A prepare past the call's deadline is refused with every violation.
	late := newCall("turn-abort", "c3", 1)
	_, err = e.l.Dispatch(ctx, late.dispatchReq())
	require.NoError(t, err)
	_, err = e.l.Prepare(ctx, protocol.PrepareRequest{ProjectID: project, AgentTurnID: late.turn, ToolCallID: late.id, CommitToken: "t",
		CommitDeadlineUnixMS: time.Now().Add(24 * time.Hour).UnixMilli()})
	requireRefused(t, err, protocol.CodeBadRequest, protocol.VInvalidValue)
	_, err = e.l.Prepare(ctx, protocol.PrepareRequest{ProjectID: project, AgentTurnID: late.turn, ToolCallID: late.id, CommitToken: "bad token"})
	pe, ok := protocol.AsError(err)
	require.True(t, ok)
	require.Equal(t, protocol.CodeBadRequest, pe.Code)
	require.Len(t, pe.Violations, 2, "%v", pe)
}

// TestTwoPhaseAbortAtCommitDeadline: with no decision by the commit
// deadline, the deadline keeper records the ledger's abort (routed to the
// tool); a commit then is refused. Without a keeper, a commit after the
// deadline records the abort itself and is refused as late.
func TestTwoPhaseAbortAtCommitDeadline(t *testing.T) {
	e := newEnv(t)
	l, reg := openLedger(t, e.srv)
	k := startKeeper(t, l, 5*time.Second)
	c := newCall("turn-cd", "c1", 1)
	prepareCall(t, l, c, "tok", 300*time.Millisecond)
	require.Eventually(t, func() bool { return len(e.decisions(t, c)) == 1 }, time.Minute, 20*time.Millisecond)
	d := e.decisions(t, c)[0]
	require.Equal(t, protocol.DecisionAbort, d.Decision)
	require.Equal(t, protocol.DecidedByCommitDeadline, d.DecidedBy)
	_, err := l.Commit(ctxT(t), decisionReq(c, "tok"))
	requireRefused(t, err, protocol.CodeConflict, protocol.VConflict)
	require.Equal(t, 1.0, counterSum(t, reg, "cgledger_ledger_two_phase_decisions_total"))

	// No keeper running for this one: the commit finds the deadline passed.
	require.NoError(t, k.Stop(ctxT(t)))
	c2 := newCall("turn-cd", "c2", 1)
	prepareCall(t, e.l, c2, "tok", 50*time.Millisecond)
	require.Eventually(t, func() bool { return time.Now().After(time.UnixMilli(mustTwoPhase(t, e.l, c2).CommitDeadlineUnixMS)) }, time.Minute, 10*time.Millisecond)
	_, err = e.l.Commit(ctxT(t), decisionReq(c2, "tok"))
	requireRefused(t, err, protocol.CodeConflict, protocol.VLate)
	ds := e.decisions(t, c2)
	require.Len(t, ds, 1)
	require.Equal(t, protocol.DecidedByCommitDeadline, ds[0].DecidedBy)
}

// TestTwoPhaseCommitRacesCommitDeadline: many prepared calls whose commit
// deadlines pass while their workers commit, through two ledger processes
// with a keeper each: every call has exactly one decision, and a commit is
// answered ok exactly when its decision is the one stored.
func TestTwoPhaseCommitRacesCommitDeadline(t *testing.T) {
	e := newEnv(t)
	a, _ := openLedger(t, e.srv)
	b, _ := openLedger(t, e.srv)
	startKeeper(t, a, 5*time.Second)
	startKeeper(t, b, 5*time.Second)
	ctx := ctxT(t)
	const n = 24
	calls := make([]call, n)
	for i := range calls {
		calls[i] = newCall("turn-race", fmt.Sprintf("c%d", i), 1)
		prepareCall(t, a, calls[i], "tok", 400*time.Millisecond)
	}
	type answer struct {
		ok  bool
		err error
	}
	answers := make([][2]answer, n)
	var wg sync.WaitGroup
	for i := range calls {
		for j, l := range []*ledger.Ledger{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Spread the commits around the deadline: not a
				// synchronisation (either outcome is checked), a point in time.
				select {
				case <-time.After(time.Duration(300+(i*7+j*50)%200) * time.Millisecond):
				case <-ctx.Done():
					return
				}
				_, err := l.Commit(ctx, decisionReq(calls[i], "tok"))
				answers[i][j] = answer{ok: err == nil, err: err}
			}()
		}
	}
	wg.Wait()
	for i, c := range calls {
		var ds []protocol.DecisionEntry
		require.Eventually(t, func() bool { ds = e.decisions(t, c); return len(ds) >= 1 }, time.Minute, 20*time.Millisecond)
		require.Len(t, ds, 1, "call %s: exactly one decision", c.id)
		oks := 0
		for _, an := range answers[i] {
			if an.ok {
				oks++
				continue
			}
			_, refused := protocol.AsError(an.err)
			require.True(t, refused, "%v", an.err)
		}
		if ds[0].Decision == protocol.DecisionCommit {
			require.Equal(t, 1, oks, "call %s: one commit won", c.id)
		} else {
			require.Equal(t, 0, oks, "call %s: aborted at the deadline, no commit answered ok", c.id)
			require.Equal(t, protocol.DecidedByCommitDeadline, ds[0].DecidedBy)
		}
	}
}

// TestTwoPhaseOverTheAPI: prepare as the call's tool and commit as its
// agent through the client; call.get with two_phase shows the state; a
// commit sent as another agent, or on another project's subject, is
// refused as forbidden, listed and recorded, and decides nothing.
func TestTwoPhaseOverTheAPI(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	ctx := ctxT(t)
	cl := client.New(e.srv.Connect(t))
	c := newCall("turn-api", "c1", 1)
	_, err := cl.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	deadline := time.Now().Add(20 * time.Second).UnixMilli()
	_, err = client.New(e.srv.Connect(t), client.WithActor("other-tool")).Prepare(ctx, protocol.PrepareRequest{ProjectID: project,
		AgentTurnID: c.turn, ToolCallID: c.id, CommitToken: "tok", CommitDeadlineUnixMS: deadline})
	requireRefused(t, err, protocol.CodeForbidden, protocol.VForbidden)
	_, err = cl.Prepare(ctx, protocol.PrepareRequest{ProjectID: project, AgentTurnID: c.turn, ToolCallID: c.id, CommitToken: "tok", CommitDeadlineUnixMS: deadline})
	require.NoError(t, err)
	tp, err := cl.TwoPhase(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.PhasePrepared, tp.State)
	require.Equal(t, "tok", tp.CommitToken, "the worker reads the token")

	nc := e.srv.Connect(t)
	body := fmt.Sprintf(`{"project_id":%q,"agent_id":%q,"agent_turn_id":%q,"tool_call_id":%q,"commit_token":"tok"}`, project, agent, c.turn, c.id)
	r := request(t, nc, protocol.APISubject(project, "agent-2", protocol.OpCommit), nil, body)
	require.False(t, r.OK)
	require.Equal(t, string(protocol.CodeForbidden), r.Error.Code)
	require.Equal(t, "body.agent_id", r.Error.Violations[0].Field)
	require.NotZero(t, r.Error.RejectionSeq)
	r = request(t, nc, protocol.APISubject("proj-2", agent, protocol.OpCommit), nil, body)
	require.False(t, r.OK)
	require.Equal(t, string(protocol.CodeForbidden), r.Error.Code)
	require.Equal(t, "body.project_id", r.Error.Violations[0].Field)
	require.NotZero(t, r.Error.RejectionSeq)
	require.Empty(t, e.decisions(t, c))

	res, err := cl.Commit(ctx, decisionReq(c, "tok"))
	require.NoError(t, err)
	require.Equal(t, protocol.DecisionCommit, res.Decision)
	ds := e.subjectEntries(t, protocol.DecisionSubject("v1", project, channel, "echo", c.turn, c.id))
	require.Len(t, ds, 1)
	require.Equal(t, agent, ds[0].Header.Get(protocol.HeaderActor))
	tp, err = cl.TwoPhase(ctx, project, c.turn, c.id)
	require.NoError(t, err)
	require.Equal(t, protocol.PhaseCommitted, tp.State)
}
