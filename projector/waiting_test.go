package projector_test

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// gauges gathers c's samples as "name{tool}" -> value.
func gauges(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			require.Len(t, m.GetLabel(), 1)
			out[fmt.Sprintf("%s{%s}", mf.GetName(), m.GetLabel()[0].GetValue())] = m.GetGauge().GetValue()
		}
	}
	return out
}

// waitingGauges are the three gauges of each tool label, in the order
// waiting, oldest age, overdue.
func waitingGauges(tools map[string][3]float64) map[string]float64 {
	out := map[string]float64{}
	for tool, v := range tools {
		out["cgledger_tool_calls_waiting{"+tool+"}"] = v[0]
		out["cgledger_tool_oldest_waiting_call_age_seconds{"+tool+"}"] = v[1]
		out["cgledger_tool_calls_overdue{"+tool+"}"] = v[2]
	}
	return out
}

// openRows lists the store's open rows (one per waiting call).
func openRows(t *testing.T, s *projector.Store) []string {
	t.Helper()
	var rows []string
	require.NoError(t, s.Dump(func(k, v []byte) error {
		if bytes.HasPrefix(k, []byte("open\x00")) {
			rows = append(rows, fmt.Sprintf("%q=%x", k, v))
		}
		return nil
	}))
	return rows
}

// dispatchedAt is the dispatch time of a call as the views hold it (the
// command entry's CG-Time).
func dispatchedAt(t *testing.T, s *projector.Store, c ledgertest.Call) time.Time {
	t.Helper()
	st, _, err := projector.NewQueries(s).CallState(c.Project, c.Turn, c.ID, projector.AsOf{})
	require.NoError(t, err)
	require.NotNil(t, st.DispatchedAt)
	return *st.DispatchedAt
}

// TestWaitingCallGauges follows calls through the gauges: a dispatch waits
// (with its age, not overdue), passes its deadline (overdue), is reported
// (nothing waits); a tool name nobody registered counts as _other, and
// every known tool is emitted at 0. The numbers come from the views: a
// restart of the projector (store closed and reopened) and a rebuild from
// sequence 1 give the same ones, from the same open rows.
func TestWaitingCallGauges(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	search := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "c1", Epoch: 1, Tool: "search"}
	madeUp := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "c2", Epoch: 1, Tool: "made-up"}
	registerSearch(t, e, "proj")
	_, err := e.L.Dispatch(ctx, search.Dispatch())
	require.NoError(t, err)
	_, err = e.L.Dispatch(ctx, madeUp.Dispatch())
	require.NoError(t, err)
	rec, err := e.L.GetCall(ctx, search.Project, search.Turn, search.ID)
	require.NoError(t, err)
	require.NotZero(t, rec.DeadlineUnixMS, "the ledger fixes a deadline at dispatch")

	dir := filepath.Join(t.TempDir(), "views")
	s := openStore(t, dir)
	p := newProjector(t, e, s, 4)
	require.NoError(t, p.CatchUp(ctx))
	d1, d2 := dispatchedAt(t, s, search), dispatchedAt(t, s, madeUp)

	labels := toollabels.New("search")
	labels.AddBuiltin("echo")
	now := d2.Add(10 * time.Second)
	cfg := projector.WaitingConfig{Label: labels.CallLabel, Known: labels.Names, Now: func() time.Time { return now }}
	c := projector.NewWaitingCollector(s, cfg)
	require.Equal(t, waitingGauges(map[string][3]float64{
		"search": {1, now.Sub(d1).Seconds(), 0},
		"_other": {1, 10, 0},
		"echo":   {0, 0, 0},
	}), gauges(t, c), "dispatched, waiting, before the deadline")

	now = time.UnixMilli(rec.DeadlineUnixMS).Add(time.Second)
	overdue := waitingGauges(map[string][3]float64{
		"search": {1, now.Sub(d1).Seconds(), 1},
		"_other": {1, now.Sub(d2).Seconds(), 1},
		"echo":   {0, 0, 0},
	})
	require.Equal(t, overdue, gauges(t, c), "past the deadline")
	graced := cfg
	graced.Grace = 5 * time.Second
	require.Equal(t, waitingGauges(map[string][3]float64{
		"search": {1, now.Sub(d1).Seconds(), 0},
		"_other": {1, now.Sub(d2).Seconds(), 0},
		"echo":   {0, 0, 0},
	}), gauges(t, projector.NewWaitingCollector(s, graced)), "past the deadline, within the keeper's grace: not overdue yet")
	rows := openRows(t, s)
	require.Len(t, rows, 2)

	// A restart of the projector: the numbers are the views', not memory.
	require.NoError(t, s.Close())
	s = openStore(t, dir)
	p = newProjector(t, e, s, 4)
	require.NoError(t, p.CatchUp(ctx))
	require.Equal(t, overdue, gauges(t, projector.NewWaitingCollector(s, cfg)), "after a restart")

	// A rebuild from sequence 1 writes the same open rows.
	require.NoError(t, p.Rebuild(ctx))
	require.Equal(t, rows, openRows(t, s), "rebuilt from sequence 1")
	c = projector.NewWaitingCollector(s, cfg)
	require.Equal(t, overdue, gauges(t, c), "after a rebuild")

	e.Complete(t, search, protocol.StatusSuccess, `{"n":1}`)
	require.NoError(t, p.CatchUp(ctx))
	require.Equal(t, overdue, gauges(t, c), "a scrape within a second of the last answers from its cache")
	now = now.Add(2 * time.Second)
	require.Equal(t, waitingGauges(map[string][3]float64{
		"search": {0, 0, 0},
		"_other": {1, now.Sub(d2).Seconds(), 1},
		"echo":   {0, 0, 0},
	}), gauges(t, c), "reported: no longer waiting")
	require.Len(t, openRows(t, s), 1, "the report deleted the call's open row")

	ready := false
	gated := cfg
	gated.Ready = func() bool { return ready }
	require.Empty(t, gauges(t, projector.NewWaitingCollector(s, gated)), "nothing while the views are not caught up")
	ready = true
	require.Len(t, gauges(t, projector.NewWaitingCollector(s, gated)), 9)
	require.NoError(t, s.Close())
}

// TestOnlyLedgerCommandsWait: a command someone else published on a
// command subject (no CG-Entry-Kind) has no call the ledger keeps a
// deadline for or accepts a report of, so it never waits: it would count
// forever.
func TestOnlyLedgerCommandsWait(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	msg := nats.NewMsg(protocol.ToolCommandSubject("v1", "proj", "main", "search"))
	msg.Header.Set(protocol.HeaderAgentID, "alice")
	msg.Header.Set(protocol.HeaderAgentTurnID, "t1")
	msg.Header.Set(protocol.HeaderTurnEpoch, "1")
	msg.Header.Set(protocol.HeaderToolCallID, "forged")
	msg.Data = []byte(`{"tool_call_card_id":"cc-forged","tool_name":"search","after_execution":"suspend","deadline_unix_ms":1}`)
	_, err := e.JS.PublishMsg(ctx, msg)
	require.NoError(t, err)

	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	require.NoError(t, newProjector(t, e, s, 4).CatchUp(ctx))
	st, _, err := projector.NewQueries(s).CallState("proj", "t1", "forged", projector.AsOf{})
	require.NoError(t, err)
	require.NotNil(t, st, "the command validates and is applied")
	require.Equal(t, projector.StateDispatched, st.State)
	w, err := s.WaitingCalls(time.Now())
	require.NoError(t, err)
	require.Empty(t, w)
	require.Empty(t, openRows(t, s))
}

// registerSearch registers tool search in project.
func registerSearch(t *testing.T, e *ledgertest.Env, project string) {
	t.Helper()
	_, err := e.L.RegisterToolYAML(ledgertest.Ctx(t), project, []byte("tool_name: search\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.search\nafter_execution: suspend\n"))
	require.NoError(t, err)
}

// TestWaitingCallsAreTheirOwnProjectsTool: a waiting call counts under its
// tool's name only when the name was registered in the call's own project
// at dispatch (or is built in): a call in project other to search,
// registered only in proj, is _other, as the ledger counts it; a call in
// proj dispatched before search was registered there is _other too, one
// after it is search. The open rows keep the project, so a rebuild and a
// restart agree.
func TestWaitingCallsAreTheirOwnProjectsTool(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	early := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "early", Epoch: 1, Tool: "search"}
	_, err := e.L.Dispatch(ctx, early.Dispatch())
	require.NoError(t, err)
	registerSearch(t, e, "proj")
	own := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "own", Epoch: 1, Tool: "search"}
	foreign := ledgertest.Call{Project: "other", Channel: "main", Agent: "bob", Turn: "t2", ID: "foreign", Epoch: 1, Tool: "search"}
	echo := ledgertest.Call{Project: "other", Channel: "main", Agent: "bob", Turn: "t2", ID: "echo", Epoch: 1, Tool: "echo"}
	for _, c := range []ledgertest.Call{own, foreign, echo} {
		_, err := e.L.Dispatch(ctx, c.Dispatch())
		require.NoError(t, err)
	}

	dir := filepath.Join(t.TempDir(), "views")
	s := openStore(t, dir)
	p := newProjector(t, e, s, 2)
	require.NoError(t, p.CatchUp(ctx))
	labels := toollabels.New("search")
	labels.AddBuiltin("echo")
	cfg := projector.WaitingConfig{Label: labels.CallLabel, Known: labels.Names, CacheFor: time.Nanosecond}
	waiting := func() map[string]float64 {
		out := map[string]float64{}
		for k, v := range gauges(t, projector.NewWaitingCollector(s, cfg)) {
			if strings.HasPrefix(k, "cgledger_tool_calls_waiting{") {
				out[k] = v
			}
		}
		return out
	}
	want := map[string]float64{
		"cgledger_tool_calls_waiting{search}": 1,
		"cgledger_tool_calls_waiting{_other}": 2,
		"cgledger_tool_calls_waiting{echo}":   1,
	}
	require.Equal(t, want, waiting())
	require.NoError(t, p.Rebuild(ctx))
	require.Equal(t, want, waiting(), "after a rebuild")
	require.NoError(t, s.Close())
	s = openStore(t, dir)
	defer s.Close()
	require.Equal(t, want, waiting(), "after a restart")
}
