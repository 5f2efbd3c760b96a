package projector_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// heldAt is the CG-Time the hand-written entries of these tests carry, so
// that their views are the same in every run.
var heldAt = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

// appendEntry publishes an entry of kind on subject into the ledger stream
// the way the ledger appends its own (CG-Entry-Kind, CG-Time, expected last
// subject sequence 0: one per call), returning its sequence.
func appendEntry(t *testing.T, e *ledgertest.Env, kind protocol.EntryKind, subject string, at time.Time, v any) uint64 {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(protocol.HeaderEntryKind, string(kind))
	msg.Header.Set(protocol.HeaderTime, protocol.FormatTime(at))
	msg.Header.Set("Nats-Expected-Last-Subject-Sequence", "0")
	ack, err := e.JS.PublishMsg(ledgertest.Ctx(t), msg)
	require.NoError(t, err)
	return ack.Sequence
}

// holdCall stores c's tool.call card and appends its held entry, as the
// ledger does for a dispatch it holds for approval.
func holdCall(t *testing.T, e *ledgertest.Env, c ledgertest.Call, at time.Time) uint64 {
	t.Helper()
	d := c.Dispatch()
	_, err := e.L.PutCard(ledgertest.Ctx(t), d.Card)
	require.NoError(t, err)
	args := json.RawMessage(fmt.Sprintf(`{"q":%q}`, c.ID))
	return appendEntry(t, e, protocol.KindHeld, protocol.HeldSubject("v1", c.Project, c.Channel, c.Turn, c.ID), at, protocol.HeldEntry{
		ProjectID: c.Project, ChannelID: c.Channel, AgentID: c.Agent, AgentTurnID: c.Turn, TurnEpoch: c.Epoch,
		ToolCallID: c.ID, ToolName: c.Tool, ToolCallCardID: c.CardID(), ArgumentsDigest: protocol.ArgumentsDigest(args),
		Reason: protocol.HeldForApproval, RequestedBy: protocol.ApprovalRequestedByDefinition, Approvers: []string{"carol"},
		ExpiresUnixMS: at.Add(time.Hour).UnixMilli(), CommandSubject: d.Subject, BudgetMS: 30_000,
	})
}

// decide appends c's approval entry.
func decide(t *testing.T, e *ledgertest.Env, c ledgertest.Call, heldSeq uint64, decision, approver string, at time.Time) uint64 {
	t.Helper()
	args := json.RawMessage(fmt.Sprintf(`{"q":%q}`, c.ID))
	return appendEntry(t, e, protocol.KindApproval, protocol.ApprovalSubject("v1", c.Project, c.Channel, c.Turn, c.ID), at, protocol.ApprovalEntry{
		ProjectID: c.Project, ChannelID: c.Channel, AgentID: c.Agent, AgentTurnID: c.Turn, TurnEpoch: c.Epoch,
		ToolCallID: c.ID, ToolName: c.Tool, ToolCallCardID: c.CardID(), ArgumentsDigest: protocol.ArgumentsDigest(args),
		Decision: decision, Approver: approver, Reason: "checked " + c.ID, DecidedUnixMS: at.UnixMilli(), HeldSeq: heldSeq,
	})
}

// approvalScenario holds three calls of tool deploy and one of search:
// c1 approved then dispatched (its command as the ledger publishes it on
// approval) and reported, c2 denied, c3 and s1 pending.
type approvalScenario struct {
	c1, c2, c3, s1                   ledgertest.Call
	held1, held2, held3, heldS       uint64
	approved, denied, dispatched, rp uint64
}

func writeApprovalScenario(t *testing.T, e *ledgertest.Env) approvalScenario {
	t.Helper()
	call := func(id, tool string) ledgertest.Call {
		return ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: id, Epoch: 1, Tool: tool}
	}
	s := approvalScenario{c1: call("c1", "deploy"), c2: call("c2", "deploy"), c3: call("c3", "deploy"), s1: call("s1", "search")}
	s.held1 = holdCall(t, e, s.c1, heldAt)
	s.held2 = holdCall(t, e, s.c2, heldAt.Add(time.Second))
	s.held3 = holdCall(t, e, s.c3, heldAt.Add(2*time.Second))
	s.heldS = holdCall(t, e, s.s1, heldAt.Add(3*time.Second))
	s.approved = decide(t, e, s.c1, s.held1, protocol.ApprovalApproved, "carol", heldAt.Add(time.Minute))
	s.denied = decide(t, e, s.c2, s.held2, protocol.ApprovalDenied, "carol", heldAt.Add(2*time.Minute))
	ctx := ledgertest.Ctx(t)
	res, err := e.L.Dispatch(ctx, s.c1.Dispatch())
	require.NoError(t, err)
	s.dispatched = res.CommandSeq
	_, err = e.L.PutCard(ctx, s.c1.ResultCard(protocol.StatusSuccess, `{"ok":true}`))
	require.NoError(t, err)
	out, err := e.L.Report(ctx, s.c1.Report(protocol.StatusSuccess))
	require.NoError(t, err)
	s.rp = out.Seq
	return s
}

func states(items []projector.ApprovalItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.ToolCallID+"="+it.State)
	}
	return out
}

// TestApprovalViews follows held calls through the views: the call state
// (awaiting_approval, then dispatched and reported once the approved
// call's command and report arrive), the calls index's state dimension,
// the call's story, approval.list's states oldest first with paging and
// foreign cursors refused, approval.get, and both as of a sequence before
// the decisions.
func TestApprovalViews(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	sc := writeApprovalScenario(t, e)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	require.NoError(t, newProjector(t, e, s, 3).CatchUp(ctx))
	q := projector.NewQueries(s)
	now := projector.AsOf{}
	beforeDecisions := projector.AsOf{Seq: sc.heldS}

	st, _, err := q.CallState("proj", "t1", "c3", now)
	require.NoError(t, err)
	require.Equal(t, projector.StateAwaitingApproval, st.State)
	require.Equal(t, sc.held3, st.HeldSeq)
	require.Zero(t, st.DispatchedSeq, "a held call has no command")
	require.Equal(t, "cc-t1-c3", st.ToolCallCardID)
	st, _, err = q.CallState("proj", "t1", "c2", now)
	require.NoError(t, err)
	require.Equal(t, projector.StateAwaitingApproval, st.State, "denied: awaiting its report")
	require.Equal(t, protocol.ApprovalDenied, st.Approval)
	require.Equal(t, sc.denied, st.ApprovalSeq)
	st, _, err = q.CallState("proj", "t1", "c1", now)
	require.NoError(t, err)
	require.Equal(t, projector.StateReported, st.State, "approved: back to the normal flow")
	require.Equal(t, sc.dispatched, st.DispatchedSeq)
	require.Equal(t, sc.held1, st.HeldSeq)
	st, _, err = q.CallState("proj", "t1", "c1", projector.AsOf{Seq: sc.dispatched})
	require.NoError(t, err)
	require.Equal(t, projector.StateDispatched, st.State)
	st, _, err = q.CallState("proj", "t1", "c1", beforeDecisions)
	require.NoError(t, err)
	require.Equal(t, projector.StateAwaitingApproval, st.State)
	require.Empty(t, st.Approval)

	// Every held call is listed once (at its held time), whatever its state.
	all, err := q.Calls("proj", projector.CallFilter{}, now, "", 0)
	require.NoError(t, err)
	var ids []string
	for _, c := range all.Items {
		ids = append(ids, c.ToolCallID)
	}
	require.Equal(t, []string{"c1", "c2", "c3", "s1"}, ids)
	awaiting, err := q.Calls("proj", projector.CallFilter{State: projector.StateAwaitingApproval}, now, "", 0)
	require.NoError(t, err)
	ids = nil
	for _, c := range awaiting.Items {
		ids = append(ids, c.ToolCallID)
	}
	require.Equal(t, []string{"c2", "c3", "s1"}, ids, "c1 was released")
	dispatched, err := q.Calls("proj", projector.CallFilter{State: projector.StateAwaitingApproval}, projector.AsOf{Seq: sc.heldS}, "", 0)
	require.NoError(t, err)
	require.Len(t, dispatched.Items, 4, "as of the last hold, all four wait")

	story, err := q.CallStory("proj", "c1", "", now)
	require.NoError(t, err)
	var kinds []string
	for _, it := range story.Items {
		kinds = append(kinds, it.Kind)
	}
	require.Subset(t, kinds, []string{"card", "held", "approval", "command", "report"})

	list := func(state string, at projector.AsOf, cursor string, limit int) *projector.Page[projector.ApprovalItem] {
		t.Helper()
		p, err := q.Approvals("proj", state, at, cursor, limit)
		require.NoError(t, err)
		return p
	}
	require.Equal(t, []string{"c3=pending", "s1=pending"}, states(list("", now, "", 0).Items))
	require.Equal(t, []string{"c3=pending", "s1=pending"}, states(list(protocol.ApprovalPending, now, "", 0).Items))
	require.Equal(t, []string{"c1=approved", "c2=denied"}, states(list(protocol.ApprovalListDecided, now, "", 0).Items))
	require.Equal(t, []string{"c1=approved", "c2=denied", "c3=pending", "s1=pending"}, states(list(protocol.ApprovalListAll, now, "", 0).Items))
	require.Equal(t, []string{"c1=pending", "c2=pending", "c3=pending", "s1=pending"}, states(list("", beforeDecisions, "", 0).Items), "as of before the decisions")
	require.Empty(t, list(protocol.ApprovalListDecided, beforeDecisions, "", 0).Items)
	require.Equal(t, []string{"c1=approved", "c2=pending", "c3=pending", "s1=pending"}, states(list(protocol.ApprovalListAll, projector.AsOf{Seq: sc.approved}, "", 0).Items))

	// Paging: one item a page, in held order, the last page without cursor.
	var paged []string
	cursor := ""
	for range 10 {
		p := list(protocol.ApprovalListAll, now, cursor, 1)
		paged = append(paged, states(p.Items)...)
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	require.Equal(t, []string{"c1=approved", "c2=denied", "c3=pending", "s1=pending"}, paged)
	first := list(protocol.ApprovalListAll, now, "", 1)
	_, err = q.Approvals("proj", protocol.ApprovalPending, now, first.NextCursor, 1)
	require.ErrorIs(t, err, protocol.ErrBadRequest, "a cursor of another state")
	_, err = q.Approvals("other", protocol.ApprovalListAll, now, first.NextCursor, 1)
	require.ErrorIs(t, err, protocol.ErrBadRequest, "a cursor of another project")
	_, err = q.Approvals("proj", "waiting", now, "", 0)
	var pe *protocol.Error
	require.True(t, errors.As(err, &pe))
	require.Equal(t, "state", pe.Violations[0].Field)

	got, seq, err := q.Approval("proj", "t1", "c1", now)
	require.NoError(t, err)
	require.NotZero(t, seq)
	require.Equal(t, protocol.ApprovalApproved, got.State)
	require.Equal(t, "carol", got.Approver)
	require.Equal(t, "checked c1", got.Reason)
	require.Equal(t, heldAt.Add(time.Minute), *got.DecidedAt)
	require.Equal(t, heldAt, got.RequestedAt)
	require.Equal(t, heldAt.Add(time.Hour), got.ExpiresAt)
	require.Equal(t, sc.held1, got.HeldSeq)
	require.Equal(t, sc.approved, got.DecisionSeq)
	require.JSONEq(t, `{"q":"c1"}`, string(got.Arguments))
	require.Equal(t, protocol.ArgumentsDigest(got.Arguments), got.ArgumentsDigest, "the digest covers the arguments shown")
	require.Equal(t, []string{"carol"}, got.Approvers)
	require.Equal(t, "deploy", got.ToolName)
	got, _, err = q.Approval("proj", "t1", "c1", beforeDecisions)
	require.NoError(t, err)
	require.Equal(t, protocol.ApprovalPending, got.State)
	require.Nil(t, got.DecidedAt)
	_, _, err = q.Approval("proj", "t1", "s1", projector.AsOf{Seq: sc.held3})
	require.ErrorIs(t, err, protocol.ErrNotFound, "not held yet as of that sequence")
	_, _, err = q.Approval("proj", "t1", "nope", now)
	require.ErrorIs(t, err, protocol.ErrNotFound)
}

// approvalRows dumps the approval rows (ap, apd, apw, apc, apt) and the
// call-state rows of a store.
func approvalRows(t *testing.T, s *projector.Store) []string {
	t.Helper()
	var rows []string
	require.NoError(t, s.Dump(func(k, v []byte) error {
		for _, tag := range []string{"ap\x00", "apd\x00", "apw\x00", "apc\x00", "apt\x00", "st\x00"} {
			if bytes.HasPrefix(k, []byte(tag)) {
				rows = append(rows, fmt.Sprintf("%q=%x", k, v))
			}
		}
		return nil
	}))
	return rows
}

var errApprovalCrash = errors.New("crash between two commits")

// TestApprovalViewsRebuildAndCrash: a rebuild from sequence 1, another
// batch size, and a projector stopped between two commits then restarted
// all give the same approval rows and digest.
func TestApprovalViewsRebuildAndCrash(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	writeApprovalScenario(t, e)
	s := openStore(t, filepath.Join(t.TempDir(), "a"))
	defer s.Close()
	p := newProjector(t, e, s, 5)
	require.NoError(t, p.CatchUp(ctx))
	want, rows := digest(t, s), approvalRows(t, s)
	require.NotEmpty(t, rows)
	require.NoError(t, p.Rebuild(ctx))
	require.Equal(t, want, digest(t, s), "rebuild")
	require.Equal(t, rows, approvalRows(t, s), "rebuild")

	for _, stopAt := range []int{1, 3, 6} {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("crash-%d", stopAt))
		c := openStore(t, dir)
		cp := newProjector(t, e, c, 2)
		commits := 0
		cp.SetAfterCommit(func(uint64) error {
			if commits++; commits == stopAt {
				return errApprovalCrash
			}
			return nil
		})
		require.ErrorIs(t, cp.CatchUp(ctx), errApprovalCrash)
		require.NoError(t, c.Close())
		c = openStore(t, dir)
		require.NoError(t, newProjector(t, e, c, 2).CatchUp(ctx))
		require.Equal(t, want, digest(t, c), "stopped after commit %d and restarted", stopAt)
		require.Equal(t, rows, approvalRows(t, c), "stopped after commit %d and restarted", stopAt)
		require.NoError(t, c.Close())
	}
}

// TestApprovalGauges: undecided approvals per tool label and the age of
// the oldest, from the views (a decision takes a call out), every known
// tool at 0, nothing while the views are not ready, and the same numbers
// after a restart of the store. deploy is registered in proj only: a call
// held in project other to deploy counts as _other (with search, which no
// project registered).
func TestApprovalGauges(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	_, err := e.L.RegisterToolYAML(ctx, "proj", []byte("tool_name: deploy\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.deploy\nafter_execution: suspend\n"))
	require.NoError(t, err)
	writeApprovalScenario(t, e)
	holdCall(t, e, ledgertest.Call{Project: "other", Channel: "main", Agent: "bob", Turn: "t9", ID: "o1", Epoch: 1, Tool: "deploy"}, heldAt.Add(4*time.Second))
	dir := filepath.Join(t.TempDir(), "views")
	s := openStore(t, dir)
	require.NoError(t, newProjector(t, e, s, 4).CatchUp(ctx))
	now := heldAt.Add(10 * time.Minute)
	labels := toollabels.New("deploy")
	labels.AddBuiltin("echo")
	cfg := projector.WaitingConfig{Label: labels.CallLabel, Known: labels.Names, Now: func() time.Time { return now }}
	want := map[string]float64{
		"cgledger_approvals_pending{deploy}":                    1,
		"cgledger_approvals_oldest_pending_age_seconds{deploy}": now.Sub(heldAt.Add(2 * time.Second)).Seconds(),
		"cgledger_approvals_pending{_other}":                    2,
		"cgledger_approvals_oldest_pending_age_seconds{_other}": now.Sub(heldAt.Add(3 * time.Second)).Seconds(),
		"cgledger_approvals_pending{echo}":                      0,
		"cgledger_approvals_oldest_pending_age_seconds{echo}":   0,
	}
	require.Equal(t, want, gauges(t, projector.NewApprovalsCollector(s, cfg)))
	notReady := cfg
	notReady.Ready = func() bool { return false }
	require.Empty(t, gauges(t, projector.NewApprovalsCollector(s, notReady)))
	require.NoError(t, s.Close())
	s = openStore(t, dir)
	defer s.Close()
	require.Equal(t, want, gauges(t, projector.NewApprovalsCollector(s, cfg)), "after a restart")
}
