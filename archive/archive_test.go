package archive_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/archive"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// The window is small so that the stream really lets entries go during the
// test; the archiver seals long before.
const (
	retention = 2 * time.Second
	sealAge   = 200 * time.Millisecond
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, time.Minute, 10*time.Millisecond, "waiting for %s", what)
}

func streamState(t *testing.T, e *ledgertest.Env) (first, last, msgs uint64) {
	t.Helper()
	s, err := e.JS.Stream(ledgertest.Ctx(t), stream.DefaultName)
	require.NoError(t, err)
	st := s.CachedInfo().State
	return st.FirstSeq, st.LastSeq, st.Msgs
}

func lastSeq(t *testing.T, e *ledgertest.Env) uint64 {
	_, last, _ := streamState(t, e)
	return last
}

// noWindow in a test's archive.Config.Retention starts the archiver with
// no retention window of its own.
const noWindow = -1

// startArchiver runs an archiver on dir until the test ends.
func startArchiver(t *testing.T, e *ledgertest.Env, dir string, cfg archive.Config) (*archive.Archiver, *archive.Archive, func()) {
	t.Helper()
	arch, err := archive.Open(dir)
	require.NoError(t, err)
	switch cfg.Retention {
	case 0:
		cfg.Retention = retention
	case noWindow:
		cfg.Retention = 0
	}
	if cfg.SealAge == 0 {
		cfg.SealAge = sealAge
	}
	a, err := archive.New(arch, e.JS, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return a, arch, stop
}

func openViews(t *testing.T, e *ledgertest.Env, arch projector.ArchiveReader) (*projector.Store, *projector.Projector) {
	t.Helper()
	s, err := projector.OpenStore(filepath.Join(t.TempDir(), "views"), projector.StoreOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	cfg := projector.Config{BatchSize: 64, Registerer: prometheus.NewRegistry()}
	if arch != nil {
		cfg.Archive = arch
	}
	p, err := projector.New(s, e.JS, cfg)
	require.NoError(t, err)
	return s, p
}

// moreCalls completes n calls in turns of their own. Calls written after
// entries expired use new ids: a Nats-Msg-Id the server still remembers
// from before the window shrank would be taken for a duplicate.
func moreCalls(t *testing.T, e *ledgertest.Env, turn string, n int) {
	t.Helper()
	for i := range n {
		c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: turn, ID: fmt.Sprintf("%s-%d", turn, i), Epoch: 1, Tool: "echo"}
		e.Complete(t, c, protocol.StatusSuccess, `{"n":2}`)
	}
}

// registerLookup registers the same tool definition every time (a second
// registration finds it unchanged).
func registerLookup(ctx context.Context, e *ledgertest.Env) (protocol.RegisterResult, error) {
	return e.L.RegisterToolYAML(ctx, "proj", []byte("tool_name: lookup\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo\nafter_execution: suspend\n"))
}

func digest(t *testing.T, s *projector.Store) string {
	t.Helper()
	d, err := s.Digest()
	require.NoError(t, err)
	return d
}

func TestExpiredHistoryIsReadFromTheArchiveAsOneChain(t *testing.T) {
	e := ledgertest.NewWithConfig(t, ledger.Config{Retention: retention})
	ctx := ledgertest.Ctx(t)
	// The archiver runs before anything is written: entries live for the
	// window (2 s) from their write, and a loaded machine can take longer
	// than that to write them all, so an archiver started afterwards would
	// rightly record the first ones lost.
	reg := prometheus.NewRegistry()
	a, arch, _ := startArchiver(t, e, t.TempDir(), archive.Config{Registerer: reg, SegmentBytes: 64 << 10})
	e.Scenario(t, 12)
	tool, err := registerLookup(ctx, e)
	require.NoError(t, err)
	e.WriteCalls(t, ctx, 100, 4)
	live, liveProj := openViews(t, e, nil)
	require.NoError(t, liveProj.CatchUp(ctx))

	written := lastSeq(t, e)
	waitFor(t, "the archive to seal every entry", func() bool { return a.Sealed() == written })
	// Every entry but the tool definition and the roster entries (ten).
	waitFor(t, "the stream to let every call's entries go", func() bool { _, _, msgs := streamState(t, e); return msgs == 11 })
	require.True(t, a.RetentionApplied())
	require.Equal(t, float64(written), metric(t, reg, "cgledger_archive_sealed_seq"))

	// Tool definitions and roster entries outlive the window: the write
	// path keeps reading them.
	_, _, kept := streamState(t, e)
	require.Positive(t, kept)
	got, err := e.L.GetTool(ctx, "proj", "lookup")
	require.NoError(t, err)
	require.Equal(t, tool.Seq, got.Seq)
	roster, err := e.L.GetRoster(ctx, "proj", "alice")
	require.NoError(t, err)
	require.Equal(t, "worker-alice", roster.WorkerTarget)
	again, err := registerLookup(ctx, e)
	require.NoError(t, err)
	require.True(t, again.Unchanged, "the definition in force is still there, not registered anew")

	// New entries, in the stream only for now.
	moreCalls(t, e, "after", 4)
	last := lastSeq(t, e)
	require.Greater(t, last, written)
	require.NoError(t, liveProj.CatchUp(ctx))

	segs, err := arch.Segments()
	require.NoError(t, err)
	require.Greater(t, len(segs), 1, "segments are sealed by size (64 KiB) as well as by age")
	for _, s := range segs {
		f, err := os.Open(s.Path)
		require.NoError(t, err)
		rep, err := stream.VerifyExport(f)
		f.Close()
		require.NoError(t, err)
		require.True(t, rep.OK, "segment %s verifies on its own: %+v", s.Path, rep)
	}

	hist := archive.History{Archive: arch, JS: e.JS, Stream: stream.DefaultName}
	var buf bytes.Buffer
	tr, err := stream.ExportHistory(ctx, hist, stream.DefaultName, &buf, 1)
	require.NoError(t, err)
	require.Equal(t, last, tr.LastSeq)
	require.Equal(t, last, tr.Count, "the export holds every entry from seq 1")
	rep, err := stream.VerifyExport(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.True(t, rep.OK, "%+v", rep)

	// A rebuild from nothing reads the archive, then the stream, and ends
	// with the same views as the ones that followed the live stream.
	rebuilt, proj := openViews(t, e, arch)
	require.NoError(t, proj.CatchUp(ctx))
	require.Equal(t, last, proj.Applied())
	require.Equal(t, digest(t, live), digest(t, rebuilt))
	vrep, err := rebuilt.VerifyHistory(ctx, hist)
	require.NoError(t, err)
	require.True(t, vrep.OK, "%+v", vrep)
	require.Equal(t, last, vrep.LastSeq)

	// Without the archive the same rebuild is a gap, never a silent jump.
	_, bare := openViews(t, e, nil)
	require.ErrorIs(t, bare.CatchUp(ctx), projector.ErrGap)
	srep, err := rebuilt.VerifyHistory(ctx, stream.JetStreamHistory{JS: e.JS, Stream: stream.DefaultName})
	require.NoError(t, err)
	require.False(t, srep.OK)
	require.Equal(t, uint64(3), srep.FirstBadSeq, "seqs 1 and 2 are roster entries, kept")
	require.Contains(t, srep.Reason, "no longer in stream")
}

// metric is the value of the one sample of a gauge or counter in reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			require.Len(t, mf.GetMetric(), 1)
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestAnEditedSegmentIsRefusedNamingIt(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 6)
	a, arch, stop := startArchiver(t, e, t.TempDir(), archive.Config{})
	written := lastSeq(t, e)
	waitFor(t, "the archive to seal every entry", func() bool { return a.Sealed() == written })
	stop()
	segs, err := arch.Segments()
	require.NoError(t, err)
	path := segs[0].Path
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	// Change one letter of a stored entry's data (base64 in the file).
	i := bytes.Index(b, []byte(`"json":`))
	require.Positive(t, i)
	j := i + len(`"json":{"`)
	b[j] ^= 0x01
	require.NoError(t, os.WriteFile(path, b, 0o640))

	err = arch.ReadRange(ctx, 1, written, func(protocol.Entry) error { return nil })
	require.ErrorIs(t, err, archive.ErrBadSegment)
	require.ErrorIs(t, err, stream.ErrHistoryCorrupt)
	require.Contains(t, err.Error(), filepath.Base(path))

	// Verification answers with a report naming the file, not a failure.
	views, _ := openViews(t, e, nil)
	rep, err := views.VerifyHistory(ctx, archive.History{Archive: arch, JS: e.JS, Stream: stream.DefaultName})
	require.NoError(t, err)
	require.False(t, rep.OK)
	require.Contains(t, rep.Reason, filepath.Base(path))
}

func TestEntriesThatExpiredUnarchivedAreRecordedAsLost(t *testing.T) {
	e := ledgertest.NewWithConfig(t, ledger.Config{Retention: retention})
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 6)
	lostTo := lastSeq(t, e)
	views, proj := openViews(t, e, nil)
	require.NoError(t, proj.CatchUp(ctx))
	// No archiver runs while the window passes (as if serve were down for
	// longer than it): every entry goes unarchived.
	// Seqs 1 and 2, the roster entries, are kept; every other entry goes.
	waitFor(t, "the stream to let every call's entry go", func() bool { _, _, msgs := streamState(t, e); return msgs == 2 })

	reg := prometheus.NewRegistry()
	a, arch, _ := startArchiver(t, e, t.TempDir(), archive.Config{Registerer: reg, LinkAt: views.LinkAt})
	waitFor(t, "the loss to be recorded", func() bool { return a.Lost() == lostTo-2 })
	lost, err := arch.Lost()
	require.NoError(t, err)
	require.Equal(t, [][2]uint64{{3, lostTo}}, lost)
	require.Equal(t, float64(lostTo-2), metric(t, reg, "cgledger_archive_lost_entries_total"))

	// What comes after the loss is archived, and its chain continues from
	// the link the views recorded, so it verifies past the loss.
	moreCalls(t, e, "after", 3)
	last := lastSeq(t, e)
	// Sealed or not yet, what follows the loss exports, chained from the
	// link the marker carries.
	hist0 := archive.History{Archive: arch, JS: e.JS, Stream: stream.DefaultName}
	var early bytes.Buffer
	tr0, err := stream.ExportHistory(ctx, hist0, stream.DefaultName, &early, lostTo+2)
	require.NoError(t, err, "an export past a loss does not wait for the next segment")
	require.Equal(t, last-lostTo-1, tr0.Count)
	rep0, err := stream.VerifyExport(bytes.NewReader(early.Bytes()))
	require.NoError(t, err)
	require.True(t, rep0.OK, "%+v", rep0)
	waitFor(t, "the archive to seal the new entries", func() bool { return a.Sealed() == last })
	var n uint64
	require.NoError(t, arch.ReadRange(ctx, lostTo+1, last, func(protocol.Entry) error { n++; return nil }))
	require.Equal(t, last-lostTo, n)
	require.NoError(t, proj.CatchUp(ctx))
	hist := archive.History{Archive: arch, JS: e.JS, Stream: stream.DefaultName}
	_, err = hist.ReadFrom(ctx, 1, func(protocol.Entry) error { return nil })
	require.ErrorIs(t, err, stream.ErrHistoryLost)
	rep, err := views.VerifyHistory(ctx, hist)
	require.NoError(t, err)
	require.False(t, rep.OK)
	require.Equal(t, uint64(3), rep.FirstBadSeq)
	var buf bytes.Buffer
	_, err = stream.ExportHistory(ctx, hist, stream.DefaultName, &buf, 1)
	require.ErrorIs(t, err, stream.ErrHistoryLost, "an export never skips lost entries silently")
	// An export of what follows the loss starts from the segment that
	// holds it, and verifies: its header carries the link after the loss.
	buf.Reset()
	tr, err := stream.ExportHistory(ctx, hist, stream.DefaultName, &buf, lostTo+1)
	require.NoError(t, err)
	require.Equal(t, last-lostTo, tr.Count)
	after, _, err := views.LinkAt(lostTo)
	require.NoError(t, err)
	require.Contains(t, strings.SplitN(buf.String(), "\n", 2)[0], after.String())
	erep, err := stream.VerifyExport(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.True(t, erep.OK, "%+v", erep)
	// A rebuild steps over the recorded loss and ends where the live views
	// are, with the same chain link: the marker carried it across.
	rebuilt, rproj := openViews(t, e, arch)
	require.NoError(t, rproj.CatchUp(ctx))
	require.Equal(t, last, rproj.Applied())
	want, ok, err := views.LinkAt(last)
	require.NoError(t, err)
	require.True(t, ok)
	got, ok, err := rebuilt.LinkAt(last)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, want, got)
	// The rebuilt views know the range they stepped over, and nothing else
	// as lost.
	_, ok, err = rebuilt.LinkAt(lostTo)
	require.NoError(t, err)
	require.False(t, ok)
	first, end, ok, err := rebuilt.LostAt(lostTo)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, [2]uint64{3, lostTo}, [2]uint64{first, end})
	for _, seq := range []uint64{2, lostTo + 1} {
		_, _, ok, err = rebuilt.LostAt(seq)
		require.NoError(t, err)
		require.False(t, ok, "seq %d", seq)
	}

	// A restart counts the loss again from its marker.
	a2, err := archive.New(arch, e.JS, archive.Config{})
	require.NoError(t, err)
	require.Equal(t, lostTo-2, a2.Lost())
}

func TestAnUnsealedSegmentLeftByACrashIsRedoneFromTheStream(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 4)
	dir := t.TempDir()
	a, _, stop := startArchiver(t, e, dir, archive.Config{Retention: time.Hour, SealAge: time.Hour})
	first := lastSeq(t, e)
	waitFor(t, "the archive to catch up and seal", func() bool { return a.Sealed() == first })
	e.Scenario(t, 2)
	stop()
	// A crash mid-segment leaves the temporary file (here: half of one).
	partial := filepath.Join(dir, "open.jsonl.tmp")
	require.NoError(t, os.WriteFile(partial, []byte(`{"format":"cgledger-export","version":2,"stream":"CG_LEDGER","from_seq":`), 0o640))
	// Checked before an archiver runs: a running one writes its own
	// segment under the same temporary name.
	_, err := archive.Open(dir)
	require.NoError(t, err)
	_, err = os.Stat(partial)
	require.True(t, errors.Is(err, os.ErrNotExist), "Open removes what a crash left unsealed")
	a, arch, _ := startArchiver(t, e, dir, archive.Config{Retention: time.Hour, SealAge: 50 * time.Millisecond})
	last := lastSeq(t, e)
	waitFor(t, "the archive to seal the rest", func() bool { return a.Sealed() == last })
	var seqs []uint64
	require.NoError(t, arch.ReadRange(ledgertest.Ctx(t), 1, last, func(en protocol.Entry) error { seqs = append(seqs, en.Seq); return nil }))
	require.Len(t, seqs, int(last))
	for i, s := range seqs {
		require.Equal(t, uint64(i+1), s)
	}
	names, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, n := range names {
		require.False(t, strings.HasSuffix(n.Name(), ".tmp"), "left behind: %s", n.Name())
	}
}

// With nothing kept (no tool definitions or roster entries), the stream
// can let every entry go: the rebuild then reads the whole history from
// the archive before it follows the stream.
func TestARebuildReadsTheArchiveWhenTheStreamKeepsNothing(t *testing.T) {
	e := ledgertest.NewWithConfig(t, ledger.Config{Retention: retention})
	ctx := ledgertest.Ctx(t)
	// Started first, as in TestExpiredHistoryIsReadFromTheArchiveAsOneChain.
	a, arch, _ := startArchiver(t, e, t.TempDir(), archive.Config{})
	moreCalls(t, e, "early", 6)
	live, liveProj := openViews(t, e, nil)
	require.NoError(t, liveProj.CatchUp(ctx))
	written := lastSeq(t, e)
	waitFor(t, "the archive to seal every entry", func() bool { return a.Sealed() == written })
	waitFor(t, "the stream to let every entry go", func() bool { _, _, msgs := streamState(t, e); return msgs == 0 })

	rebuilt, proj := openViews(t, e, arch)
	require.NoError(t, proj.CatchUp(ctx))
	require.Equal(t, written, proj.Applied())
	require.Equal(t, digest(t, live), digest(t, rebuilt))

	// Run follows the stream from after the archive.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- proj.Run(runCtx) }()
	moreCalls(t, e, "late", 2)
	require.NoError(t, liveProj.CatchUp(ctx))
	last := lastSeq(t, e)
	waitFor(t, "the rebuilt views to follow the stream", func() bool { return proj.Applied() == last })
	stop()
	require.NoError(t, <-done)
	require.Equal(t, digest(t, live), digest(t, rebuilt))
}

// The stream keeps a tool definition (no TTL) while every call after it
// expires: a rebuild reads the archive past the kept entry rather than
// waiting for the stream to deliver entries it no longer has.
func TestARebuildReadsPastKeptEntriesWhenTheTailExpired(t *testing.T) {
	e := ledgertest.NewWithConfig(t, ledger.Config{Retention: retention})
	ctx := ledgertest.Ctx(t)
	_, err := registerLookup(ctx, e)
	require.NoError(t, err)
	a, arch, _ := startArchiver(t, e, t.TempDir(), archive.Config{})
	moreCalls(t, e, "tail", 3)
	live, liveProj := openViews(t, e, nil)
	require.NoError(t, liveProj.CatchUp(ctx))
	written := lastSeq(t, e)
	waitFor(t, "the archive to seal every entry", func() bool { return a.Sealed() == written })
	waitFor(t, "the stream to keep only the tool definition", func() bool { _, _, msgs := streamState(t, e); return msgs == 1 })

	rebuilt, proj := openViews(t, e, arch)
	require.NoError(t, proj.CatchUp(ctx))
	require.Equal(t, written, proj.Applied())
	require.Equal(t, digest(t, live), digest(t, rebuilt))
}

// Entries that expired unarchived at the end of the stream, which the views
// never saw: once the archiver's first pass has recorded them, a rebuild
// steps over them and ends at the stream's last sequence.
func TestARebuildStepsOverALossAtTheEnd(t *testing.T) {
	e := ledgertest.NewWithConfig(t, ledger.Config{Retention: retention})
	ctx := ledgertest.Ctx(t)
	_, err := registerLookup(ctx, e)
	require.NoError(t, err)
	moreCalls(t, e, "gone", 3)
	written := lastSeq(t, e)
	waitFor(t, "the stream to keep only the tool definition", func() bool { _, _, msgs := streamState(t, e); return msgs == 1 })

	a, arch, _ := startArchiver(t, e, t.TempDir(), archive.Config{})
	select {
	case <-a.FirstPass():
	case <-ctx.Done():
		t.Fatal("no first pass")
	}
	require.Equal(t, written-1, a.Lost())
	// A restart does not record (or count) the same loss again.
	a2, err := archive.New(arch, e.JS, archive.Config{Retention: retention, SealAge: sealAge})
	require.NoError(t, err)
	actx, stopA2 := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a2.Run(actx) }()
	<-a2.FirstPass()
	stopA2()
	<-done
	require.Equal(t, written-1, a2.Lost())
	lost, err := arch.Lost()
	require.NoError(t, err)
	require.Len(t, lost, 1)
	rebuilt, proj := openViews(t, e, arch)
	require.NoError(t, proj.CatchUp(ctx))
	require.Equal(t, written, proj.Applied())
	_, ok, err := rebuilt.LinkAt(1)
	require.NoError(t, err)
	require.True(t, ok, "the kept entry is in the views")
}

// TestEntriesWrittenWithAWindowAreArchivedByAnArchiverWithout covers serve
// restarted without retention over a ledger written with it: the entries
// still expire on their own TTL, and the archiver, with no window and an
// hour's seal age, seals them in time anyway (a tenth of their TTL) and
// loses none.
func TestEntriesWrittenWithAWindowAreArchivedByAnArchiverWithout(t *testing.T) {
	e := ledgertest.NewWithConfig(t, ledger.Config{Retention: retention})
	ctx := ledgertest.Ctx(t)
	a, arch, _ := startArchiver(t, e, t.TempDir(), archive.Config{Retention: noWindow, SealAge: time.Hour})
	select {
	case <-a.FirstPass():
	case <-ctx.Done():
		t.Fatal("the archiver's first pass did not end")
	}
	// Written after the archiver caught up, so only the seal age seals them.
	e.Scenario(t, 6)
	last := lastSeq(t, e)
	waitFor(t, "every entry to be sealed", func() bool { return a.Sealed() == last })
	waitFor(t, "the stream to let every call's entry go", func() bool { _, _, msgs := streamState(t, e); return msgs == 2 })
	require.Zero(t, a.Lost())
	var n uint64
	require.NoError(t, arch.ReadRange(ctx, 1, last, func(protocol.Entry) error { n++; return nil }))
	require.Equal(t, last, n)
}
