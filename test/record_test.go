package test

// Deterministic replay harness: scripted recordings and their goldens.
//
// Each scenario below is a script run against a real embedded JetStream
// server, a real ledger and (where the scenario needs tools) a real
// executor. Every step waits for the ledger to reach the state it expects
// before the next one, so a script always writes the same entries in the
// same order; only times, trace ids and the deadlines quoted in timeout
// messages differ between two recordings.
//
// Files, per scenario <name>, in testdata/ (written only by -update):
//
//	<name>.jsonl            the recording: ledger.Export of the scenario's ledger
//	<name>.digest           replay.Run's view digest, chain head, entry count
//	<name>.timelines.json   every turn's Timeline and every agent's Inbox
//	                        (all states) after replaying the recording
//
// Flow (CI never skips; every test asserts in both modes):
//
//   - go test ./test -run TestRecordScenarios -update
//     records every scenario, writes the three files per scenario, and (in
//     the same run) TestReplayGoldens replays them back and checks them.
//     This is the only way the goldens change; never edit them by hand.
//
//   - go test ./test   (CI)
//     TestRecordScenarios records every scenario afresh into t.TempDir() and
//     checks that the fresh recording has the committed recording's shape:
//     the same entry kinds and subjects in the same sequence, the same
//     entry kinds in every turn's timeline, the same Inbox calls with the
//     same status, effective after_execution and state. A behaviour change
//     in the ledger or executor fails here until the goldens are
//     regenerated (and the diff reviewed).
//     TestReplayGoldens replays every committed recording with replay.Run
//     and compares the digest, chain head and views JSON with the goldens
//     byte for byte, and checks stream.VerifyExport on the file. It also
//     fails when a scenario has no golden or a golden has no scenario.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

type replayScenario struct {
	name   string
	script func(t *testing.T, r *replayRig)
}

var replayScenarios = []replayScenario{
	{"happy_path", happyPath},
	{"duplicates_and_stale_epochs", duplicatesAndStaleEpochs},
	{"invalid_commands", invalidCommands},
	{"timeouts_and_retries", timeoutsAndRetries},
	{"cancellation", cancellation},
	{"cg_control_overrides", cgControlOverrides},
	{"manifest_fields", manifestFields},
	{"ledger_deadlines", ledgerDeadlines},
	{"two_phase_commit", twoPhaseCommit},
	{"operator_actions", operatorActions},
	{"approvals", approvals},
	{"tool_pause", toolPause},
}

// happyPath: two rostered agents and one without a roster entry run echo
// calls through the executor (echo registered in the project); some results
// are consumed, some stay pending.
func happyPath(t *testing.T, r *replayRig) {
	r.roster("alice", "bob")
	echo := *executor.EchoDefinition
	echo.ProjectID, echo.Description = scProject, "Returns its arguments (registered by the project)."
	_, err := r.L.RegisterTool(r.ctx(), &echo)
	require.NoError(t, err)
	r.startExecutor()

	weather := scCall("alice", "turn-alice-1", "call-weather", 1, "echo")
	news := scCall("alice", "turn-alice-1", "call-news", 1, "echo")
	lookup := scCall("bob", "turn-bob-1", "call-lookup", 1, "echo")
	ping := scCall("carol", "turn-carol-1", "call-ping", 1, "echo") // carol has no roster entry
	summary := scCall("bob", "turn-bob-2", "call-summary", 2, "echo")
	require.Equal(t, protocol.StatusSuccess, r.run(weather, `{"city":"Lisbon"}`, nil).Status)
	require.Equal(t, protocol.StatusSuccess, r.run(news, `{"topic":"markets","limit":3}`, nil).Status)
	require.Equal(t, protocol.StatusSuccess, r.run(lookup, `{"id":42}`, nil).Status)
	require.Equal(t, protocol.StatusSuccess, r.run(ping, `{"ping":true}`, nil).Status)
	tr := r.run(summary, `{"text":"all done"}`, func(req *protocol.DispatchRequest) { req.Payload.AfterExecution = protocol.AfterTerminate })
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.JSONEq(t, `{"text":"all done"}`, string(tr.Result))

	r.consume(weather)
	r.consume(lookup)
	r.consume(ping)
	again := r.consume(weather)
	require.True(t, again.Duplicate, "consuming twice is idempotent")
}

// duplicatesAndStaleEpochs: a reported call reported again (duplicates),
// with a stale and a future epoch, with a different result (conflict), by
// the wrong agent (mismatch); a repeated and a conflicting dispatch; a
// repeated consume.
func duplicatesAndStaleEpochs(t *testing.T, r *replayRig) {
	r.roster("alice")
	first := scCall("alice", "turn-dup", "call-first", 3, "search")
	second := scCall("alice", "turn-dup", "call-second", 3, "search")

	out := r.Complete(t, first, protocol.StatusSuccess, `{"hits":3}`)
	require.False(t, out.Duplicate)
	for range 2 {
		dup, err := r.L.Report(r.ctx(), first.Report(protocol.StatusSuccess))
		require.NoError(t, err)
		require.True(t, dup.Duplicate)
		require.Equal(t, out.Seq, dup.Seq, "a duplicate answers with the original report")
	}
	again, err := r.L.Dispatch(r.ctx(), first.Dispatch())
	require.NoError(t, err)
	require.True(t, again.Duplicate, "the same dispatch again is a duplicate")

	for _, epoch := range []uint64{2, 4} {
		stale := first
		stale.Epoch = epoch
		_, err := r.L.Report(r.ctx(), stale.Report(protocol.StatusSuccess))
		requireRefused(t, err, protocol.ErrStaleEpoch, "report with another epoch")
	}

	_, err = r.L.PutCard(r.ctx(), first.ResultCard(protocol.StatusFailed, `null`))
	require.NoError(t, err)
	_, err = r.L.Report(r.ctx(), first.Report(protocol.StatusFailed))
	requireRefused(t, err, protocol.ErrConflict, "a different result")

	wrong := first
	wrong.Agent = "mallory"
	_, err = r.L.Report(r.ctx(), wrong.Report(protocol.StatusSuccess))
	requireRefused(t, err, protocol.ErrMismatch, "report by another agent")

	changed := dispatchReq(first, `{"q":"something else"}`)
	_, err = r.L.Dispatch(r.ctx(), changed)
	requireRefused(t, err, protocol.ErrConflict, "the same call dispatched with different content")

	r.Complete(t, second, protocol.StatusSuccess, `{"hits":0}`)
	require.False(t, r.consume(second).Duplicate)
	require.True(t, r.consume(second).Duplicate)
	dup, err := r.L.Report(r.ctx(), second.Report(protocol.StatusSuccess))
	require.NoError(t, err)
	require.True(t, dup.Duplicate, "a duplicate after consumption")
}

// invalidCommands: a dispatch refused with several violations; raw commands
// published straight on cmd.tool.echo that the executor answers with
// rejection entries (no identity, a call never dispatched, a payload that is
// not JSON) or, when the identity names a dispatched call, with a failed
// bad_request result; arguments that fail the tool's schema; reports naming
// a result card or a call that does not exist.
func invalidCommands(t *testing.T, r *replayRig) {
	r.roster("bob")
	r.startExecutor()
	rejections := 0
	nextRejection := func() {
		t.Helper()
		rejections++
		r.waitKind(string(protocol.KindRejection), rejections)
	}

	bad := scCall("bob", "turn-invalid", "call-bad", 1, "echo")
	req := bad.Dispatch()
	req.Payload.AfterExecution = "later"
	req.Payload.ToolCallCardID = "cc-somewhere-else"
	req.Card.ProjectID = "other"
	req.Card.Content = json.RawMessage(`{"tool_name":"echo"}`)
	_, err := r.L.Dispatch(r.ctx(), req)
	le := requireRefused(t, err, protocol.ErrBadRequest, "invalid dispatch")
	require.GreaterOrEqual(t, len(le.Violations), 3, "every violation at once: %+v", le.Violations)
	nextRejection()

	publish := func(h nats.Header, data string) {
		t.Helper()
		_, err := r.JS.PublishMsg(r.ctx(), &nats.Msg{Subject: "cg.v1.proj.main.cmd.tool.echo", Header: h, Data: []byte(data)})
		require.NoError(t, err)
	}
	// No identity, inline arguments: one rejection listing every problem.
	publish(nats.Header{"X-Client": {"raw-publisher"}}, `{"args":{"x":1}}`)
	nextRejection()
	// A well-formed command for a call the ledger never dispatched.
	ghost := scCall("bob", "turn-invalid", "call-ghost", 1, "echo")
	publish(ghost.Identity().Header(), `{"tool_call_card_id":"cc-turn-invalid-call-ghost","after_execution":"suspend"}`)
	nextRejection()
	// A payload that is not JSON.
	publish(ghost.Identity().Header(), `not json at all`)
	nextRejection()

	// An invalid command reusing the identity of a dispatched call (parked
	// on a tool no executor serves): answered through the report path.
	parked := scCall("bob", "turn-invalid", "call-parked", 1, "parked")
	r.dispatch(dispatchReq(parked, `{"x":1}`))
	publish(parked.Identity().Header(), `{"arguments":{"x":1}}`)
	tr := r.resolved(parked)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, executor.ErrBadRequest, tr.Error.Code)

	// Arguments that do not match sleep's schema.
	sleepy := scCall("bob", "turn-invalid", "call-sleepy", 1, "sleep")
	tr = r.run(sleepy, `{"ms":"soon","extra":true}`, nil)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, executor.ErrBadRequest, tr.Error.Code)

	// A report pointing at a result card that was never written.
	orphan := scCall("bob", "turn-invalid", "call-orphan", 1, "parked")
	r.dispatch(dispatchReq(orphan, `{}`))
	_, err = r.L.Report(r.ctx(), orphan.Report(protocol.StatusSuccess))
	requireRefused(t, err, protocol.ErrUnknownCard, "unknown result card")
	nextRejection()
	// A report for a call that was never dispatched.
	_, err = r.L.Report(r.ctx(), ghost.Report(protocol.StatusSuccess))
	requireRefused(t, err, protocol.ErrUnknownCall, "unknown call")
	nextRejection()
}

// timeoutsAndRetries: sleep past a small timeout_ms; a flaky idempotent
// tool that succeeds on its third attempt; one whose retries run out; a
// side-effectful one that is never retried.
func timeoutsAndRetries(t *testing.T, r *replayRig) {
	r.roster("alice")
	flaky := executor.ToolFunc(func(_ context.Context, c *executor.Call) executor.Outcome {
		if c.Attempt < 3 {
			return executor.Retryable("R-UPSTREAM-503", "upstream busy", 0)
		}
		return executor.Success(map[string]any{"attempt": c.Attempt})
	})
	down := executor.ToolFunc(func(context.Context, *executor.Call) executor.Outcome {
		return executor.Retryable("R-UPSTREAM-503", "upstream still down", 0)
	})
	tiny := protocol.RetryPolicy{MaxAttempts: 5, BaseMS: 1, CapMS: 2}
	r.startExecutor(
		toolImpl{"flaky", flaky, toolDef("flaky", protocol.DeterminismIdempotent, tiny)},
		toolImpl{"down", down, toolDef("down", protocol.DeterminismIdempotent, protocol.RetryPolicy{MaxAttempts: 2, BaseMS: 1, CapMS: 2})},
		toolImpl{"charge", down, toolDef("charge", protocol.DeterminismSideEffectful, tiny)},
	)
	type detail struct {
		TaxonomyCode string `json:"taxonomy_code"`
		Attempts     int    `json:"attempts"`
	}
	errDetail := func(tr protocol.ToolResultContent) detail {
		t.Helper()
		require.NotNil(t, tr.Error)
		var d detail
		require.NoError(t, json.Unmarshal(tr.Error.Detail, &d))
		return d
	}

	slow := scCall("alice", "turn-retry", "call-slow", 1, "sleep")
	tr := r.run(slow, `{"ms":60000}`, func(req *protocol.DispatchRequest) { req.Payload.TimeoutMS = 50 })
	require.Equal(t, protocol.StatusTimeout, tr.Status)
	require.Equal(t, executor.ErrToolTimeout, tr.Error.Code)
	require.Equal(t, executor.CodeTimeout, errDetail(tr).TaxonomyCode)

	fl := scCall("alice", "turn-retry", "call-flaky", 1, "flaky")
	tr = r.run(fl, `{}`, nil)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.JSONEq(t, `{"attempt":3}`, string(tr.Result))

	dn := scCall("alice", "turn-retry", "call-down", 1, "down")
	tr = r.run(dn, `{}`, nil)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, executor.ErrUpstreamUnavailable, tr.Error.Code)
	require.Equal(t, 2, errDetail(tr).Attempts)

	ch := scCall("alice", "turn-retry", "call-charge", 1, "charge")
	tr = r.run(ch, `{}`, nil)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, 1, errDetail(tr).Attempts, "side-effectful tools are never retried")
}

// cancellation: a call canceled before any executor picked it up (answered
// without running), one canceled while its tool runs, a repeated cancel,
// and a cancel of a call that already has its result (refused).
func cancellation(t *testing.T, r *replayRig) {
	r.roster("alice")
	started := make(chan string, 4)
	blocker := executor.ToolFunc(func(ctx context.Context, c *executor.Call) executor.Outcome {
		started <- c.ToolCallID
		<-ctx.Done()
		return executor.Retryable("R-UPSTREAM-NET", "interrupted", 0)
	})
	ex := r.newExecutor(toolImpl{"blocker", blocker, toolDef("blocker", protocol.DeterminismIdempotent, protocol.RetryPolicy{MaxAttempts: 1, BaseMS: 1, CapMS: 1})})
	cancel := func(c ledgertest.Call, reason string) (protocol.CancelResult, error) {
		return r.L.Cancel(r.ctx(), protocol.CancelRequest{ProjectID: c.Project, AgentID: c.Agent, AgentTurnID: c.Turn, ToolCallID: c.ID, Reason: reason})
	}

	queued := scCall("alice", "turn-cancel", "call-queued", 1, "blocker")
	r.dispatch(dispatchReq(queued, `{}`))
	res, err := cancel(queued, "changed my mind")
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	r.start(ex)
	tr := r.resolved(queued)
	require.Equal(t, protocol.StatusCanceled, tr.Status)
	require.Empty(t, started, "a call canceled before pickup never runs")

	running := scCall("alice", "turn-cancel", "call-running", 1, "blocker")
	r.dispatch(dispatchReq(running, `{}`))
	select {
	case id := <-started:
		require.Equal(t, running.ID, id)
	case <-time.After(scWaitFor):
		t.Fatal("blocker never started")
	}
	_, err = cancel(running, "user stop")
	require.NoError(t, err)
	tr = r.resolved(running)
	require.Equal(t, protocol.StatusCanceled, tr.Status)
	require.Equal(t, "canceled", tr.Error.Code)
	res, err = cancel(running, "user stop")
	require.NoError(t, err)
	require.True(t, res.Duplicate, "canceling again is idempotent")

	done := scCall("alice", "turn-cancel", "call-done", 1, "echo")
	require.Equal(t, protocol.StatusSuccess, r.run(done, `{"v":1}`, nil).Status)
	_, err = cancel(done, "too late")
	requireRefused(t, err, protocol.ErrConflict, "cancel after the result")
}

// cgControlOverrides: result cards whose result.__cg_control.after_execution
// overrides the report's after_execution: terminate over suspend, suspend
// over terminate, an invalid value and a non-object control (both ignored),
// and an override that comes out of a real tool (echo returns it). The
// report carries the command's after_execution unchanged, as it must.
func cgControlOverrides(t *testing.T, r *replayRig) {
	r.roster("alice")
	r.startExecutor()
	complete := func(c ledgertest.Call, result, reportAfter, want string) {
		t.Helper()
		d := c.Dispatch()
		d.Payload.AfterExecution = reportAfter
		r.dispatch(d)
		_, err := r.L.PutCard(r.ctx(), c.ResultCard(protocol.StatusSuccess, result))
		require.NoError(t, err)
		rep := c.Report(protocol.StatusSuccess)
		rep.Payload.AfterExecution = reportAfter
		out, err := r.L.Report(r.ctx(), rep)
		require.NoError(t, err)
		require.Equal(t, want, out.EffectiveAfterExecution, c.ID)
	}
	complete(scCall("alice", "turn-control", "call-terminate", 1, "search"),
		`{"answer":42,"__cg_control":{"after_execution":"terminate"}}`, protocol.AfterSuspend, protocol.AfterTerminate)
	complete(scCall("alice", "turn-control", "call-suspend", 1, "search"),
		`{"draft":true,"__cg_control":{"after_execution":"suspend"}}`, protocol.AfterTerminate, protocol.AfterSuspend)
	complete(scCall("alice", "turn-control", "call-invalid", 1, "search"),
		`{"answer":0,"__cg_control":{"after_execution":"later"}}`, protocol.AfterSuspend, protocol.AfterSuspend)
	complete(scCall("alice", "turn-control", "call-not-object", 1, "search"),
		`{"answer":1,"__cg_control":"terminate"}`, protocol.AfterSuspend, protocol.AfterSuspend)

	viaTool := scCall("alice", "turn-control", "call-echo", 1, "echo")
	tr := r.run(viaTool, `{"note":"stop here","__cg_control":{"after_execution":"terminate"}}`, nil)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.Equal(t, protocol.AfterTerminate, tr.EffectiveAfterExecution(protocol.AfterSuspend))
	r.consume(scCall("alice", "turn-control", "call-terminate", 1, "search"))
}

// manifestFields: the manifest fields of seed 004. A tool with a
// result_schema answers one call with a result that breaks it (failed,
// C-CONTRACT-RESULT) and, after version 2.0.0 is registered, one that
// matches; a tool with health.fail_fast_after_ms that nobody serves is
// answered at dispatch, failed with S-TOOL-UNAVAILABLE, by the ledger.
func manifestFields(t *testing.T, r *replayRig) {
	r.roster("alice")
	ghost := toolDef("ghost", protocol.DeterminismPure, protocol.RetryPolicy{})
	ghost.ProjectID, ghost.Version, ghost.Owner = scProject, "1.0.0", "@team-ghost"
	ghost.Health = &protocol.ToolHealth{FailFastAfterMS: 1}
	_, err := r.L.RegisterTool(r.ctx(), ghost)
	require.NoError(t, err)

	shaped := toolDef("shaped", protocol.DeterminismPure, protocol.RetryPolicy{})
	r.startExecutor(toolImpl{"shaped", executor.ToolFunc(func(_ context.Context, c *executor.Call) executor.Outcome {
		return executor.Success(map[string]any{"n": c.Arguments["n"], "version": c.Definition.Version})
	}), shaped})
	v1 := *shaped
	v1.ProjectID, v1.Version, v1.Owner = scProject, "1.0.0", "@team-shapes"
	v1.ResultSchema = json.RawMessage(`{"type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}`)
	_, err = r.L.RegisterTool(r.ctx(), &v1)
	require.NoError(t, err)
	type detail struct {
		TaxonomyCode string               `json:"taxonomy_code"`
		Violations   []protocol.Violation `json:"violations"`
	}
	bad := scCall("alice", "turn-manifest", "call-bad-shape", 1, "shaped")
	tr := r.run(bad, `{"n":"three"}`, nil)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	var d detail
	require.NoError(t, json.Unmarshal(tr.Error.Detail, &d))
	require.Equal(t, protocol.CodeResultContract, d.TaxonomyCode)
	require.Len(t, d.Violations, 1)

	v2 := v1
	v2.Version = "2.0.0"
	_, err = r.L.RegisterTool(r.ctx(), &v2)
	require.NoError(t, err)
	good := scCall("alice", "turn-manifest", "call-good-shape", 1, "shaped")
	tr = r.run(good, `{"n":3}`, nil)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.JSONEq(t, `{"n":3,"version":"2.0.0"}`, string(tr.Result))

	// Well over a millisecond since ghost was registered, and nothing
	// pulls its commands.
	gc := scCall("alice", "turn-manifest", "call-ghost", 1, "ghost")
	res := r.dispatch(dispatchReq(gc, `{}`))
	require.True(t, res.ToolUnavailable)
	tr = r.resolved(gc)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.NoError(t, json.Unmarshal(tr.Error.Detail, &d))
	require.Equal(t, protocol.CodeToolUnavailable, d.TaxonomyCode)
}

// TestRecordScenarios records every scenario: into testdata with -update
// (then writing the goldens), else into a temporary directory, checking the
// fresh recording's shape against the committed one.
func TestRecordScenarios(t *testing.T) {
	for _, sc := range replayScenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			r := newReplayRig(t)
			sc.script(t, r)
			fresh := filepath.Join(t.TempDir(), sc.name+".jsonl")
			r.export(fresh)
			got := replayFile(t, fresh, false)
			if *update {
				require.NoError(t, os.MkdirAll(testdataDir, 0o755))
				require.NoError(t, writeGolden(goldenPath(sc.name, ".digest"), stableJSON(t, got.digestFile())))
				require.NoError(t, writeGolden(goldenPath(sc.name, ".timelines.json"), stableJSON(t, got.views)))
				require.NoError(t, copyGolden(fresh, goldenPath(sc.name, ".jsonl")))
				return
			}
			golden := goldenPath(sc.name, ".jsonl")
			require.FileExists(t, golden, "regenerate: go test ./test -run TestRecordScenarios -update")
			require.Equal(t, fileShape(t, golden), fileShape(t, fresh), "entry kinds and subjects of a fresh recording")
			require.Equal(t, viewsShape(readViews(t, goldenPath(sc.name, ".timelines.json"))), viewsShape(got.views), "timelines and inboxes of a fresh recording")
		})
	}
}

// TestReplayGoldens replays every committed recording and compares it with
// its goldens byte for byte. It runs after TestRecordScenarios (same file,
// declared later, and parallel tests wait for the sequential ones), so an
// -update run checks the files it has just written.
func TestReplayGoldens(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(testdataDir, "*.jsonl"))
	require.NoError(t, err)
	var have, want []string
	for _, f := range files {
		have = append(have, strings.TrimSuffix(filepath.Base(f), ".jsonl"))
	}
	for _, sc := range replayScenarios {
		want = append(want, sc.name)
	}
	sort.Strings(have)
	sort.Strings(want)
	require.Equal(t, want, have, "one recording per scenario (regenerate: go test ./test -run TestRecordScenarios -update)")

	for _, name := range have {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := goldenPath(name, ".jsonl")
			f, err := os.Open(path)
			require.NoError(t, err)
			rep, err := stream.VerifyExport(f)
			require.NoError(t, f.Close())
			require.NoError(t, err)
			require.True(t, rep.OK, "%s verifies: first bad seq %d: %s", path, rep.FirstBadSeq, rep.Reason)

			got := replayFile(t, path, false)
			require.Equal(t, rep.Count, got.res.Entries)
			require.Equal(t, rep.Head, got.res.ChainHead, "the projected chain head is the file's")

			wantDigest, err := os.ReadFile(goldenPath(name, ".digest"))
			require.NoError(t, err)
			require.Equal(t, string(wantDigest), string(stableJSON(t, got.digestFile())), "digest golden")
			wantViews, err := os.ReadFile(goldenPath(name, ".timelines.json"))
			require.NoError(t, err)
			require.Equal(t, string(wantViews), string(stableJSON(t, got.views)), "timelines golden")
		})
	}
}

// ledgerDeadlines: calls nobody answers end timeout, recorded by the ledger
// (card, report, wakeup, cancel): one by a report that came after the
// deadline (which records the timeout, then is refused as late), one by
// the deadline keeper; a late report to the second is refused too.
func ledgerDeadlines(t *testing.T, r *replayRig) {
	r.roster("alice")
	// A second ledger process on the same stream, with no grace after the
	// deadline, so that the script need not wait it out.
	l, err := ledger.Open(r.ctx(), r.NC, ledger.Config{DeadlineGrace: -1})
	require.NoError(t, err)
	t.Cleanup(l.Close)
	late := func(c ledgertest.Call) {
		t.Helper()
		rc := c.ResultCard(protocol.StatusSuccess, `{"ok":true}`)
		_, err := l.PutCard(r.ctx(), rc)
		require.NoError(t, err)
		_, err = l.Report(r.ctx(), c.Report(protocol.StatusSuccess))
		le := requireRefused(t, err, protocol.ErrConflict, "a late report")
		require.Equal(t, protocol.VLate, le.Violations[0].Code)
	}
	pastDeadline := func(c ledgertest.Call) {
		t.Helper()
		rec, err := l.GetCall(r.ctx(), c.Project, c.Turn, c.ID)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return time.Now().After(rec.Deadline()) }, scWaitFor, scPollGap)
	}

	reported := scCall("alice", "turn-deadline", "call-late", 1, "nobody")
	r.dispatch(withTimeout(dispatchReq(reported, `{}`), 1))
	pastDeadline(reported)
	late(reported)
	tr := r.resolved(reported)
	require.Equal(t, protocol.StatusTimeout, tr.Status)
	r.waitKind("cancel", 1)

	kept := scCall("alice", "turn-deadline", "call-kept", 1, "nobody")
	r.dispatch(withTimeout(dispatchReq(kept, `{}`), 1))
	k, err := l.StartDeadlineKeeper(r.ctx(), ledger.DeadlineKeeperConfig{})
	require.NoError(t, err)
	tr = r.resolved(kept)
	require.NoError(t, k.Stop(r.ctx()))
	require.Equal(t, protocol.StatusTimeout, tr.Status)
	r.waitKind("cancel", 2)
	late(kept)
}

func withTimeout(req protocol.DispatchRequest, ms int64) protocol.DispatchRequest {
	req.Payload.TimeoutMS = ms
	return req
}

// scPay is a two-phase scenario tool: Prepare answers a token named after
// the call (with a commit deadline of commitIn, or 300 ms for call-expire),
// Commit succeeds and Rollback fails with S-TOOL-ABORTED.
type scPay struct{}

func (scPay) Run(context.Context, *executor.Call) executor.Outcome {
	return executor.Terminal("S-TOOL-CONFIG", "Run is never called for a Preparer", "")
}

func (scPay) Prepare(_ context.Context, c *executor.Call) (*executor.Prepared, executor.Outcome) {
	in := 20 * time.Second
	if c.ToolCallID == "call-expire" {
		in = 300 * time.Millisecond
	}
	return &executor.Prepared{Token: "tok-" + c.ToolCallID, CommitDeadline: time.Now().Add(in)}, executor.Outcome{}
}

func (scPay) Commit(_ context.Context, _ *executor.Call, token string) executor.Outcome {
	return executor.Success(map[string]string{"paid": token})
}

func (scPay) Rollback(_ context.Context, _ *executor.Call, token string) executor.Outcome {
	return executor.Terminal("S-TOOL-ABORTED", "payment "+token+" rolled back", "")
}

// twoPhaseCommit: a side-effectful tool that prepares (attempt, prepared
// entry, prepared wakeup): one call committed by its worker, one aborted
// by its worker, one aborted by the ledger's deadline keeper at its commit
// deadline; each decision runs Commit or Rollback, whose outcome is the
// call's one report; a commit after the ledger's abort is refused.
func twoPhaseCommit(t *testing.T, r *replayRig) {
	r.roster("alice")
	r.startExecutor(toolImpl{"pay", scPay{}, toolDef("pay", protocol.DeterminismSideEffectful, protocol.RetryPolicy{})})
	prepared := func(c ledgertest.Call) *protocol.TwoPhase {
		t.Helper()
		var tp *protocol.TwoPhase
		require.Eventually(t, func() bool {
			var err error
			tp, err = r.L.TwoPhase(r.ctx(), c.Project, c.Turn, c.ID)
			return err == nil && tp != nil
		}, scWaitFor, scPollGap, "call %s is prepared", c.ID)
		return tp
	}
	decide := func(c ledgertest.Call) protocol.DecisionRequest {
		return protocol.DecisionRequest{ProjectID: c.Project, AgentID: c.Agent, AgentTurnID: c.Turn, ToolCallID: c.ID, CommitToken: "tok-" + c.ID}
	}
	wakeups := 0
	step := func(c ledgertest.Call) {
		t.Helper()
		r.dispatch(dispatchReq(c, `{"amount":5}`))
		tp := prepared(c)
		require.Equal(t, "tok-"+c.ID, tp.CommitToken)
		wakeups++
		r.waitKind(string(protocol.KindWakeup), wakeups) // the prepared wakeup
	}

	commit := scCall("alice", "turn-2pc", "call-commit", 1, "pay")
	step(commit)
	_, err := r.L.Commit(r.ctx(), decide(commit))
	require.NoError(t, err)
	tr := r.resolved(commit)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.JSONEq(t, `{"paid":"tok-call-commit"}`, string(tr.Result))
	wakeups++
	r.waitKind(string(protocol.KindWakeup), wakeups)

	abort := scCall("alice", "turn-2pc", "call-abort", 1, "pay")
	step(abort)
	_, err = r.L.Abort(r.ctx(), decide(abort))
	require.NoError(t, err)
	tr = r.resolved(abort)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	wakeups++
	r.waitKind(string(protocol.KindWakeup), wakeups)

	expire := scCall("alice", "turn-2pc", "call-expire", 1, "pay")
	step(expire)
	k, err := r.L.StartDeadlineKeeper(r.ctx(), ledger.DeadlineKeeperConfig{})
	require.NoError(t, err)
	tr = r.resolved(expire)
	require.NoError(t, k.Stop(r.ctx()))
	require.Equal(t, protocol.StatusFailed, tr.Status)
	wakeups++
	r.waitKind(string(protocol.KindWakeup), wakeups)
	tp, err := r.L.TwoPhase(r.ctx(), expire.Project, expire.Turn, expire.ID)
	require.NoError(t, err)
	require.Equal(t, protocol.PhaseAborted, tp.State)
	require.Equal(t, protocol.DecidedByCommitDeadline, tp.DecidedBy)
	_, err = r.L.Commit(r.ctx(), decide(expire))
	requireRefused(t, err, protocol.ErrConflict, "commit after the ledger's abort")
}

// operatorActions: an operator (actor "ops") cancels another agent's call
// parked on a tool nobody serves (its cancel entry) and is refused the
// cancel of a reported call; a side_effectful call whose attempt started
// ends failed S-TOOL-OUTCOME-UNKNOWN, the operator resolves it not_applied
// (a resolution entry, the report untouched), and a second, different
// resolution is refused; the operator then redrives it (a redrive entry,
// the derived call call-lost~r1 dispatched and reported success), and a
// second, different redrive is refused.
func operatorActions(t *testing.T, r *replayRig) {
	r.roster("alice")
	cancelOf := func(c ledgertest.Call, reason string) (protocol.OperatorCancelResult, error) {
		return r.L.OperatorCancel(r.ctx(), "ops", protocol.OperatorCancelRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, Reason: reason})
	}
	parked := scCall("alice", "turn-ops", "call-parked", 1, "nobody")
	r.dispatch(dispatchReq(parked, `{}`))
	res, err := cancelOf(parked, "runaway spend")
	require.NoError(t, err)
	require.Equal(t, protocol.KindCancel, res.Entry)

	done := scCall("alice", "turn-ops", "call-done", 1, "nobody")
	r.Complete(t, done, protocol.StatusSuccess, `{"ok":true}`)
	_, err = cancelOf(done, "too late")
	requireRefused(t, err, protocol.ErrConflict, "cancel of a reported call")

	lost := scCall("alice", "turn-ops", "call-lost", 1, "pay")
	r.dispatch(dispatchReq(lost, `{"amount":5}`))
	_, err = r.L.StartAttempt(r.ctx(), protocol.AttemptStartRequest{ProjectID: lost.Project, AgentTurnID: lost.Turn, ToolCallID: lost.ID, ExecutorID: "pay-svc"})
	require.NoError(t, err)
	card := lost.ResultCard(protocol.StatusFailed, `null`)
	card.Content = json.RawMessage(`{"status":"failed","result":null,"error":{"code":"internal_error","message":"outcome lost","detail":{"taxonomy_code":"S-TOOL-OUTCOME-UNKNOWN"}}}`)
	_, err = r.L.PutCard(r.ctx(), card)
	require.NoError(t, err)
	rep := lost.Report(protocol.StatusFailed)
	rep.Payload.AttemptOutcome = protocol.AttemptOutcomeUnknown
	_, err = r.L.Report(r.ctx(), rep)
	require.NoError(t, err)
	resolve := protocol.ResolveRequest{ProjectID: lost.Project, AgentTurnID: lost.Turn, ToolCallID: lost.ID, Effect: protocol.EffectNotApplied, Reason: "no charge upstream"}
	_, err = r.L.Resolve(r.ctx(), "ops", resolve)
	require.NoError(t, err)
	resolve.Effect = protocol.EffectApplied
	_, err = r.L.Resolve(r.ctx(), "ops", resolve)
	requireRefused(t, err, protocol.ErrConflict, "a second resolution")

	// Resolved not_applied, the lost call is redriven: the derived call
	// call-lost~r1 (same arguments and idempotency key) is dispatched, and
	// its report wakes alice; a second, different redrive is refused.
	redrive := protocol.RedriveRequest{ProjectID: lost.Project, AgentTurnID: lost.Turn, ToolCallID: lost.ID, Reason: "charge it now"}
	rd, err := r.L.Redrive(r.ctx(), "ops", redrive)
	require.NoError(t, err)
	require.Equal(t, "call-lost~r1", rd.RedriveCallID)
	derived := lost
	derived.ID = rd.RedriveCallID
	// The derived call's tool.call card keeps the original's metadata,
	// which its result card copies.
	result := derived.ResultCard(protocol.StatusSuccess, `{"charged":5}`)
	result.Metadata = lost.Meta()
	_, err = r.L.PutCard(r.ctx(), result)
	require.NoError(t, err)
	_, err = r.L.Report(r.ctx(), derived.Report(protocol.StatusSuccess))
	require.NoError(t, err)
	redrive.Reason = "once more"
	_, err = r.L.Redrive(r.ctx(), "ops", redrive)
	requireRefused(t, err, protocol.ErrConflict, "a second redrive")
}

// approvals: calls held for approval (docs/approvals.md), each with its
// held entry and one decision: approved (the command released, the approved
// wakeup, the echo result), denied (after refusals: an approver the tool
// does not list, a digest that is not the arguments'; and an approve after
// the denial: conflict), canceled by the worker (held because its dispatch
// asked), expired (an approve after the expiry time stores the ledger's
// expiry and is refused).
func approvals(t *testing.T, r *replayRig) {
	r.roster("alice")
	for _, tool := range []struct {
		name    string
		timeout int64
	}{{"deploy", 0}, {"hotfix", 1000}} {
		def := toolDef(tool.name, protocol.DeterminismIdempotent, protocol.RetryPolicy{MaxAttempts: 1, BaseMS: 1, CapMS: 1})
		def.ProjectID, def.TargetSubject = scProject, "cg.v1.{project_id}.{channel_id}.cmd.tool.echo"
		def.Approval = &protocol.ToolApproval{Required: true, Approvers: []string{"carol"}, TimeoutMS: tool.timeout}
		_, err := r.L.RegisterTool(r.ctx(), def)
		require.NoError(t, err)
	}
	held := func(c ledgertest.Call, args string, mod func(*protocol.DispatchRequest)) *protocol.CallRecord {
		t.Helper()
		req := dispatchReq(c, args)
		// The registered tools' target: the built-in echo runs them.
		req.Subject = protocol.ToolCommandSubject("v1", c.Project, c.Channel, "echo")
		if mod != nil {
			mod(&req)
		}
		d := r.dispatch(req)
		require.True(t, d.AwaitingApproval, "call %s is held", c.ID)
		rec, err := r.L.GetCall(r.ctx(), c.Project, c.Turn, c.ID)
		require.NoError(t, err)
		require.Equal(t, protocol.StateAwaitingApproval, rec.State)
		return rec
	}
	decide := func(op, approver string, c ledgertest.Call, digest, reason string) (protocol.ApprovalResult, error) {
		req := protocol.ApprovalRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, ToolCallCardID: c.CardID(),
			ArgumentsDigest: digest, Reason: reason}
		if op == protocol.OpDeny {
			return r.L.Deny(r.ctx(), approver, req)
		}
		return r.L.Approve(r.ctx(), approver, req)
	}

	approved := scCall("alice", "turn-approvals", "call-approved", 1, "deploy")
	rec := held(approved, `{"env":"prod","version":"1.4.2"}`, nil)
	res, err := decide(protocol.OpApprove, "carol", approved, rec.Held.ArgumentsDigest, "release 1.4.2")
	require.NoError(t, err)
	require.NotZero(t, res.CommandSeq)
	// The executor starts once the approval's follow-up (the command, the
	// approved wakeup) is stored: running earlier, its result card could
	// land between the two, and the recording would differ run to run.
	r.startExecutor()
	tr := r.resolved(approved)
	require.Equal(t, protocol.StatusSuccess, tr.Status)
	require.JSONEq(t, `{"env":"prod","version":"1.4.2"}`, string(tr.Result))

	denied := scCall("alice", "turn-approvals", "call-denied", 1, "deploy")
	rec = held(denied, `{"env":"prod","version":"2.0.0"}`, nil)
	_, err = decide(protocol.OpApprove, "dave", denied, rec.Held.ArgumentsDigest, "")
	var pe *protocol.Error
	require.ErrorAs(t, err, &pe, "an approver the tool does not list is refused")
	require.Equal(t, protocol.CodeForbidden, pe.Code)
	_, err = decide(protocol.OpApprove, "carol", denied, protocol.ArgumentsDigest([]byte(`{"env":"staging"}`)), "")
	requireRefused(t, err, protocol.ErrMismatch, "another digest")
	_, err = decide(protocol.OpDeny, "carol", denied, rec.Held.ArgumentsDigest, "not during the freeze")
	require.NoError(t, err)
	tr = r.resolved(denied)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, protocol.ErrorCodeAuthFailed, tr.Error.Code)
	_, err = decide(protocol.OpApprove, "carol", denied, rec.Held.ArgumentsDigest, "")
	requireRefused(t, err, protocol.ErrConflict, "an approve after the denial")

	asked := scCall("alice", "turn-approvals", "call-canceled", 1, "echo")
	held(asked, `{"text":"ask first"}`, func(req *protocol.DispatchRequest) { req.Approval = &protocol.DispatchApproval{Required: true} })
	_, err = r.L.Cancel(r.ctx(), protocol.CancelRequest{ProjectID: asked.Project, AgentID: asked.Agent, AgentTurnID: asked.Turn, ToolCallID: asked.ID, Reason: "not needed"})
	require.NoError(t, err)
	tr = r.resolved(asked)
	require.Equal(t, protocol.StatusCanceled, tr.Status)

	expired := scCall("alice", "turn-approvals", "call-expired", 1, "hotfix")
	rec = held(expired, `{"patch":"p-7"}`, nil)
	require.Eventually(t, func() bool { return time.Now().UnixMilli() > rec.Held.ExpiresUnixMS }, scWaitFor, scPollGap)
	_, err = decide(protocol.OpApprove, "carol", expired, rec.Held.ArgumentsDigest, "too late")
	requireRefused(t, err, protocol.ErrConflict, "an approve after the expiry")
	tr = r.resolved(expired)
	require.Equal(t, protocol.StatusFailed, tr.Status)
	require.Equal(t, protocol.ErrorCodeBadRequest, tr.Error.Code)
}

// toolPause: an admin pauses echo; a call dispatched meanwhile is held (a
// held entry, reason paused, no command); pausing again is refused; the
// resume publishes its command and the executor runs it. (One call: two
// released at once would run concurrently, and the recording's order with
// them.)
func toolPause(t *testing.T, r *replayRig) {
	r.roster("alice")
	echo := *executor.EchoDefinition
	echo.ProjectID = scProject
	_, err := r.L.RegisterTool(r.ctx(), &echo)
	require.NoError(t, err)
	r.startExecutor()
	pause := protocol.ToolPauseRequest{ProjectID: scProject, ToolName: "echo", Reason: "upstream maintenance"}
	_, err = r.L.PauseTool(r.ctx(), "ops", pause)
	require.NoError(t, err)
	held := scCall("alice", "turn-pause", "call-held", 1, "echo")
	res := r.dispatch(dispatchReq(held, `{"n":1}`))
	require.True(t, res.Paused, "held while echo is paused")
	_, err = r.L.PauseTool(r.ctx(), "ops", protocol.ToolPauseRequest{ProjectID: scProject, ToolName: "echo", Reason: "again"})
	requireRefused(t, err, protocol.ErrConflict, "a pause of a paused tool")
	resumed, err := r.L.ResumeTool(r.ctx(), "ops", protocol.ToolPauseRequest{ProjectID: scProject, ToolName: "echo", Reason: "maintenance over"})
	require.NoError(t, err)
	require.Equal(t, 1, resumed.Released)
	require.Equal(t, protocol.StatusSuccess, r.resolved(held).Status)
}
