package projector_test

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/replay"
	"github.com/cgledger/cgledger/stream"
)

// waitFor polls cond until it holds, failing after a minute. It waits on
// the projector's own progress, never on a fixed delay.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, time.Minute, 5*time.Millisecond, "waiting for %s", what)
}

// exportFile writes the whole ledger to a file and returns its path.
func exportFile(t *testing.T, e *ledgertest.Env) string {
	t.Helper()
	var buf bytes.Buffer
	_, err := e.L.Export(ledgertest.Ctx(t), &buf, 1)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o600))
	return path
}

// entryByEntryDigest applies the ledger one entry per batch into a fresh
// store, without NATS, and returns its digest.
func entryByEntryDigest(t *testing.T, e *ledgertest.Env, last uint64) string {
	t.Helper()
	s := openStore(t, filepath.Join(t.TempDir(), "one-by-one"))
	defer s.Close()
	require.NoError(t, projector.ApplyEntries(s, ledgerEntries(t, e, last), 1))
	return digest(t, s)
}

func seqsOf[T any](items []T, seq func(T) uint64) []uint64 {
	var out []uint64
	for _, it := range items {
		out = append(out, seq(it))
	}
	return out
}

// TestUnrecognizedEntriesDoNotStopTheProjector publishes, between real
// ledger entries, messages the projector cannot interpret (an unknown kind,
// an old release's kind, no kind on a ledger-only subject, a subject outside
// the grammar, a kind on another kind's subject) and checks each is recorded
// as unrecognized, listed, placed in the timeline it names, counted, named
// by both verifiers, and that later entries are projected, with the same
// digest after a rebuild, with other batch sizes, and in a replay.
func TestUnrecognizedEntriesDoNotStopTheProjector(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	turnHdr := func(kind string) nats.Header {
		h := nats.Header{protocol.HeaderProjectID: []string{"proj"}, protocol.HeaderAgentTurnID: []string{"turn-after"}}
		if kind != "" {
			h.Set(protocol.HeaderEntryKind, kind)
		}
		return h
	}
	farFuture := kindHeader("bogus")
	farFuture.Set(protocol.HeaderTime, "2200-01-01T00:00:00Z")
	bad := []struct {
		subject string
		h       nats.Header
		code    string
	}{
		{"cg.v1.proj.main.ledger.report.turn-bogus.call-bogus", farFuture, protocol.UnrecognizedUnknownKind},
		{"cg.v1.proj.main.ledger.report.turn-old.call-old", kindHeader("report_v0"), protocol.UnrecognizedUnknownKind},
		{"cg.v1.proj.card.fake", nil, protocol.UnrecognizedNoKind},
		{"cg.not.in.the.grammar.at.all", turnHdr("card"), protocol.UnrecognizedOutsideGrammar},
		{"cg.v1.proj.card.fake", kindHeader("roster"), protocol.UnrecognizedKindMismatch},
	}
	var badSeqs []uint64
	for _, b := range bad {
		badSeqs = append(badSeqs, publishRaw(t, e.JS, b.subject, b.h, `{"project_id":"proj"}`))
	}
	after := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "turn-after", ID: "after", Epoch: 1, Tool: "echo"}
	e.Complete(t, after, protocol.StatusSuccess, `{"n":2}`)
	last := streamLastSeq(t, e)

	dir := filepath.Join(t.TempDir(), "views")
	s := openStore(t, dir)
	defer s.Close()
	sp := newStopProjector(t, e.JS, s, projector.Config{BatchSize: 4})
	require.NoError(t, sp.CatchUp(ctx))
	require.Equal(t, last, sp.Applied())
	requireMetric(t, sp.reg, float64(len(bad)), "cgledger_projector_unrecognized_entries_total")
	requireMetric(t, sp.reg, 0, "cgledger_projector_stalled")
	want := digest(t, s)

	q := projector.NewQueries(s)
	st, _, err := q.CallState("proj", "turn-after", "after", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, projector.StateReported, st.State, "entries after the unrecognized ones are projected")

	page, err := q.Unrecognized(projector.AsOf{}, "", 0)
	require.NoError(t, err)
	require.Equal(t, badSeqs, seqsOf(page.Items, func(u projector.UnrecognizedEntry) uint64 { return u.Seq }))
	for i, u := range page.Items {
		require.Equal(t, bad[i].subject, u.Subject)
		require.Equal(t, bad[i].code, u.Code, "entry %d: %s", u.Seq, u.Reason)
		require.NotEmpty(t, u.Reason)
	}
	require.Contains(t, page.Items[0].Reason, `unknown CG-Entry-Kind "bogus"`)
	require.Equal(t, 2200, page.Items[0].Time.Year(), "the claimed time is shown")

	// Paging, and as of a sequence before the third one.
	p1, err := q.Unrecognized(projector.AsOf{}, "", 2)
	require.NoError(t, err)
	require.Len(t, p1.Items, 2)
	require.NotEmpty(t, p1.NextCursor)
	p2, err := q.Unrecognized(projector.AsOf{}, p1.NextCursor, 2)
	require.NoError(t, err)
	require.Equal(t, badSeqs[2:4], seqsOf(p2.Items, func(u projector.UnrecognizedEntry) uint64 { return u.Seq }))
	early, err := q.Unrecognized(projector.AsOf{Seq: badSeqs[2] - 1}, "", 0)
	require.NoError(t, err)
	require.Len(t, early.Items, 2)

	// Placed where the subject or the headers name a turn.
	tl, err := q.Timeline("proj", "turn-bogus", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, []string{projector.KindUnrecognized}, kinds(tl.Items))
	require.Contains(t, tl.Items[0].Reason, "bogus")
	tl, err = q.Timeline("proj", "turn-after", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, projector.KindUnrecognized, tl.Items[0].Kind)
	require.Equal(t, badSeqs[3], tl.Items[0].Seq)
	require.Greater(t, len(tl.Items), 1)

	// The far-future CG-Time did not move the time watermark: "as of now"
	// still sees the entries after it.
	now, _, err := q.CallState("proj", "turn-after", "after", projector.AsOf{Time: time.Now()})
	require.NoError(t, err)
	require.Equal(t, projector.StateReported, now.State)

	// Same views from scratch, by any path.
	require.NoError(t, sp.Rebuild(ctx))
	require.Equal(t, want, digest(t, s), "rebuild from seq 1")
	other := openStore(t, filepath.Join(t.TempDir(), "other"))
	defer other.Close()
	require.NoError(t, newProjector(t, e, other, 10000).CatchUp(ctx))
	require.Equal(t, want, digest(t, other), "one batch")
	require.Equal(t, want, entryByEntryDigest(t, e, last), "one entry per batch")

	// Both verifiers pass and name the unrecognized entries.
	rep, err := s.VerifyStream(ctx, e.JS, "")
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep)
	require.Equal(t, uint64(len(bad)), rep.UnrecognizedCount)
	require.Equal(t, badSeqs, seqsOf(rep.Unrecognized, func(n stream.NotedEntry) uint64 { return n.Seq }))
	path := exportFile(t, e)
	f, err := os.Open(path)
	require.NoError(t, err)
	frep, err := stream.VerifyExport(f)
	require.NoError(t, f.Close())
	require.NoError(t, err)
	require.True(t, frep.OK, "%+v", frep)
	require.Equal(t, badSeqs, seqsOf(frep.Unrecognized, func(n stream.NotedEntry) uint64 { return n.Seq }))
	require.Equal(t, protocol.UnrecognizedKindMismatch, frep.Unrecognized[4].Code)

	// A replay of the export projects it to the same views.
	res, err := replay.Run(ctx, path, replay.Options{})
	require.NoError(t, err)
	require.Equal(t, want, res.Digest)
	require.Equal(t, last, res.AppliedSeq)

	// The audit API lists them.
	srv := httptest.NewServer(httpapi.Audit(q, httpapi.AuditConfig{}))
	t.Cleanup(srv.Close)
	var hp projector.Page[projector.UnrecognizedEntry]
	require.Equal(t, 200, getJSON(t, srv.URL+"/v1/unrecognized?limit=3", &hp))
	require.Equal(t, badSeqs[:3], seqsOf(hp.Items, func(u projector.UnrecognizedEntry) uint64 { return u.Seq }))
	require.Equal(t, last, hp.AsOfSeq)
	var eb errBody
	require.Equal(t, 400, getJSON(t, srv.URL+"/v1/unrecognized?cursor=nope", &eb))
}

// TestSkipUnsticksACorruptEntry stops a running projector on a corrupt
// ledger entry, then has an operator write a skip entry with Ledger.Skip and
// checks that the projector, run the way a server runs it (Run, and
// WaitForSkip when Run stops), records the entry as skipped and goes on
// without a restart; that the skip shows in the views, the timeline and both
// verifiers; and that rebuilds, other batch sizes and a replay of the
// export give the same digest.
func TestSkipUnsticksACorruptEntry(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	bad := publishRaw(t, e.JS, "cg.v1.proj.main.ledger.report.t.c", kindHeader("report"), "not json")
	after := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "turn-after", ID: "after", Epoch: 1, Tool: "echo"}
	e.Complete(t, after, protocol.StatusSuccess, `{"n":2}`)

	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	sp := newStopProjector(t, e.JS, s, projector.Config{BatchSize: 5, SkipPollInterval: 10 * time.Millisecond})
	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	stops := make(chan error, 10)
	go func() {
		// What a server does: run; on a stop, wait for a skip and run again.
		for {
			err := sp.Run(runCtx)
			if runCtx.Err() != nil {
				runDone <- nil
				return
			}
			stops <- err
			if werr := sp.WaitForSkip(runCtx, err); werr != nil {
				if runCtx.Err() != nil {
					werr = nil
				}
				runDone <- werr
				return
			}
		}
	}()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-runDone)
	})

	select {
	case err := <-stops:
		require.ErrorIs(t, err, projector.ErrCorruptEntry)
		require.Contains(t, err.Error(), "at seq "+itoa(bad))
	case <-time.After(time.Minute):
		require.FailNow(t, "the projector did not stop on the corrupt entry")
	}
	require.Equal(t, bad-1, sp.Applied())
	requireMetric(t, sp.reg, 1, "cgledger_projector_stalled")

	// Refusals name the problem precisely and write nothing.
	last := streamLastSeq(t, e)
	_, err := e.L.Skip(ctx, last+5, "typo")
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	require.Contains(t, err.Error(), "sequence "+itoa(last+5)+" is past the end of the ledger (last seq "+itoa(last)+")")
	_, err = e.L.Skip(ctx, bad, "  ")
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	require.Equal(t, last, streamLastSeq(t, e), "a refused skip appends nothing")

	const reason = "incident 42: report written by a buggy build; result re-sent as seq N+2"
	res, err := e.L.Skip(ctx, bad, reason)
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	require.Equal(t, bad, res.Seq)
	require.Equal(t, last+1, res.SkipSeq)
	require.Equal(t, "cg.v1.proj.main.ledger.report.t.c", res.Subject)

	waitFor(t, "the projector to pass the skip entry", func() bool { return sp.Applied() >= res.SkipSeq })
	requireMetric(t, sp.reg, 1, "cgledger_projector_skipped_entries_total")
	requireMetric(t, sp.reg, 0, "cgledger_projector_stalled")

	// Running live again: a new call is projected.
	later := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "turn-later", ID: "later", Epoch: 1, Tool: "echo"}
	e.Complete(t, later, protocol.StatusSuccess, `{"n":3}`)
	last = streamLastSeq(t, e)
	waitFor(t, "the projector to apply the later call", func() bool { return sp.Applied() == last })

	// Repeating the skip is a duplicate; another reason is a conflict.
	dup, err := e.L.Skip(ctx, bad, reason)
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, res.SkipSeq, dup.SkipSeq)
	_, err = e.L.Skip(ctx, bad, "another reason")
	require.ErrorIs(t, err, protocol.ErrConflict)
	require.Equal(t, last, streamLastSeq(t, e), "neither appended anything")

	q := projector.NewQueries(s)
	st, _, err := q.CallState("proj", "turn-after", "after", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, projector.StateReported, st.State, "the entries after the skipped one are projected")
	skipped, err := q.Skipped(projector.AsOf{}, "", 0)
	require.NoError(t, err)
	require.Len(t, skipped.Items, 1)
	require.Equal(t, projector.SkippedEntry{Seq: bad, Subject: "cg.v1.proj.main.ledger.report.t.c",
		Headers: map[string][]string{protocol.HeaderEntryKind: {"report"}}, SkipSeq: res.SkipSeq, Reason: reason}, skipped.Items[0])
	skips, err := q.Skips(projector.AsOf{}, "", 0)
	require.NoError(t, err)
	require.Len(t, skips.Items, 1)
	require.Equal(t, res.SkipSeq, skips.Items[0].Seq)
	require.Equal(t, bad, skips.Items[0].SkippedSeq)
	require.True(t, skips.Items[0].Effective)
	require.False(t, skips.Items[0].Time.IsZero())
	// The skipped entry and its skip are in the timeline of the turn the
	// skipped entry's subject names.
	tl, err := q.Timeline("proj", "t", projector.AsOf{})
	require.NoError(t, err)
	require.Equal(t, []string{projector.KindSkipped, string(protocol.KindSkip)}, kinds(tl.Items))
	require.Equal(t, res.SkipSeq, tl.Items[0].SkipSeq)
	require.Equal(t, reason, tl.Items[0].Reason)
	// As of the skipped entry, the skip entry is not there yet.
	tl, err = q.Timeline("proj", "t", projector.AsOf{Seq: bad})
	require.NoError(t, err)
	require.Equal(t, []string{projector.KindSkipped}, kinds(tl.Items))

	stop()
	require.NoError(t, <-runDone)
	runDone <- nil // for the cleanup
	want := digest(t, s)

	// Same views from scratch, by any path: the skip is in the stream.
	sp2 := newStopProjector(t, e.JS, s, projector.Config{BatchSize: 3})
	require.NoError(t, sp2.Rebuild(ctx))
	require.Equal(t, want, digest(t, s), "rebuild from seq 1")
	requireMetric(t, sp2.reg, 1, "cgledger_projector_skipped_entries_total")
	other := openStore(t, filepath.Join(t.TempDir(), "other"))
	defer other.Close()
	require.NoError(t, newProjector(t, e, other, 10000).CatchUp(ctx))
	require.Equal(t, want, digest(t, other), "one batch: the skip and the skipped entry in the same batch")
	require.Equal(t, want, entryByEntryDigest(t, e, last), "one entry per batch")

	// Both verifiers pass and name the skip.
	rep, err := s.VerifyStream(ctx, e.JS, "")
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep)
	require.Equal(t, []stream.NotedSkip{{Seq: bad, SkipSeq: res.SkipSeq, Reason: reason}}, rep.Skips)
	path := exportFile(t, e)
	f, err := os.Open(path)
	require.NoError(t, err)
	frep, err := s.VerifyExport(f)
	require.NoError(t, f.Close())
	require.NoError(t, err)
	require.True(t, frep.OK, "%+v", frep)
	require.Equal(t, rep.Skips, frep.Skips)
	res2, err := replay.Run(ctx, path, replay.Options{})
	require.NoError(t, err)
	require.Equal(t, want, res2.Digest, "a replay of the export")
}

// TestWaitForSkipReturnsAtOnceForOtherStops checks WaitForSkip only waits
// on corrupt entries: a gap cannot be skipped, and nil is not a stop.
func TestWaitForSkipReturnsAtOnceForOtherStops(t *testing.T) {
	g := newGapEnv(t)
	g.publish(t, 3)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	sp := newStopProjector(t, g.js, s, projector.Config{Stream: gapStream})
	gap := projector.ErrGap
	require.ErrorIs(t, sp.WaitForSkip(ledgertest.Ctx(t), gap), projector.ErrGap)
	require.NoError(t, sp.WaitForSkip(ledgertest.Ctx(t), nil))

	// A corrupt stop with no skip waits until the context ends.
	ctx, cancel := context.WithCancel(ledgertest.Ctx(t))
	cancel()
	err := sp.WaitForSkip(ctx, projector.ErrCorruptEntry)
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
}
