package projector_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// metricValue reads one series of a counter or gauge from reg; labels are
// name/value pairs. found is false when the series does not exist.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) (v float64, found bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if len(got) != len(labels)/2 {
				continue
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue series
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), true
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue(), true
			default:
				require.FailNow(t, "metricValue reads counters and gauges only", name)
			}
		}
	}
	return 0, false
}

func requireMetric(t *testing.T, reg *prometheus.Registry, want float64, name string, labels ...string) {
	t.Helper()
	v, ok := metricValue(t, reg, name, labels...)
	require.True(t, ok, "metric %s%v is not exported", name, labels)
	require.Equal(t, want, v, "metric %s%v", name, labels)
}

// stopProjector is a projector with its own registry, counting the commit
// hook's calls.
type stopProjector struct {
	*projector.Projector
	reg     *prometheus.Registry
	commits atomic.Int64
}

func newStopProjector(t *testing.T, js jetstream.JetStream, s *projector.Store, cfg projector.Config) *stopProjector {
	t.Helper()
	sp := &stopProjector{reg: prometheus.NewRegistry()}
	cfg.Registerer = sp.reg
	p, err := projector.New(s, js, cfg)
	require.NoError(t, err)
	p.SetAfterCommit(func(uint64) error { sp.commits.Add(1); return nil })
	sp.Projector = p
	return sp
}

// requireStopped checks that err stops the projector for good at seq with
// the views exactly through seq-1, and the metrics say so.
func requireStopped(t *testing.T, sp *stopProjector, err error, kind error, reason string, seq uint64, wantDigest string) {
	t.Helper()
	require.ErrorIs(t, err, kind)
	require.True(t, projector.Fatal(err), "%v must be fatal", err)
	require.Equal(t, seq-1, sp.Applied(), "the views stop right before the bad entry: %v", err)
	applied, serr := sp.Store().Applied()
	require.NoError(t, serr)
	require.Equal(t, seq-1, applied, "the store's checkpoint")
	require.Equal(t, wantDigest, digest(t, sp.Store()), "the views are exactly the entries before seq %d", seq)
	requireMetric(t, sp.reg, 1, "cgledger_projector_errors_total", "reason", reason)
	requireMetric(t, sp.reg, 1, "cgledger_projector_stalled")
	requireMetric(t, sp.reg, float64(seq-1), "cgledger_projector_applied_sequence")
}

// prefixDigest is the digest of views holding exactly entries 1..upTo of
// the ledger stream.
func prefixDigest(t *testing.T, e *ledgertest.Env, upTo uint64) string {
	t.Helper()
	s := openStore(t, filepath.Join(t.TempDir(), "prefix"))
	defer s.Close()
	if upTo > 0 {
		require.NoError(t, projector.ApplyEntries(s, ledgerEntries(t, e, upTo), 64))
	}
	return digest(t, s)
}

func publishRaw(t *testing.T, js jetstream.JetStream, subject string, h nats.Header, data string) uint64 {
	t.Helper()
	ack, err := js.PublishMsg(ledgertest.Ctx(t), &nats.Msg{Subject: subject, Header: h, Data: []byte(data)})
	require.NoError(t, err)
	return ack.Sequence
}

func kindHeader(kind string) nats.Header {
	return nats.Header{protocol.HeaderEntryKind: []string{kind}}
}

// TestCorruptEntryStopsWithoutSkipping publishes entries the projector
// cannot apply (known kinds whose data is bad) into a real ledger, between
// good entries, and checks that the projector commits every good entry
// before the bad one, stops exactly there naming the sequence, exports the
// stop, and, with no skip entry written, never gets past it: not on restart,
// not from Run, not in a rebuild. (Unknown kinds do not stop it: see
// TestUnrecognizedEntriesDoNotStopTheProjector.)
func TestCorruptEntryStopsWithoutSkipping(t *testing.T) {
	cases := []struct {
		name, subject, kind, data string
		want                      string // in the error, after "at seq N: "
	}{
		{"report_not_json", "cg.v1.proj.main.ledger.report.t.c", "report", "not json", "report entry data does not decode"},
		{"report_without_identity", "cg.v1.proj.main.ledger.report.t.c", "report", `{"project_id":"proj"}`, "report entry without valid identity"},
		{"card_not_json", "cg.v1.proj.card.x", "card", "{", "card entry data does not decode"},
		{"roster_without_agent", "cg.v1.proj.roster.x", "roster", `{"project_id":"proj"}`, "roster entry without valid project_id/agent_id"},
		{"ledger_command_invalid", "cg.v1.proj.main.cmd.tool.search", "command", "{}", "command written by the ledger does not validate"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := ledgertest.New(t)
			e.Scenario(t, 3)
			ctx := ledgertest.Ctx(t)
			bad := publishRaw(t, e.JS, tc.subject, kindHeader(tc.kind), tc.data)
			// Good entries after the bad one: they must never be applied.
			e.Complete(t, ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "turn-after", ID: "after", Epoch: 1, Tool: "echo"}, protocol.StatusSuccess, `{"n":2}`)
			last := streamLastSeq(t, e)
			require.Greater(t, last, bad)
			want := prefixDigest(t, e, bad-1)

			dir := filepath.Join(t.TempDir(), "views")
			s := openStore(t, dir)
			// One batch holds the whole ledger, so the entries before the
			// bad one are committed by the stop itself, not by a batch.
			sp := newStopProjector(t, e.JS, s, projector.Config{BatchSize: 10000})
			err := sp.CatchUp(ctx)
			requireStopped(t, sp, err, projector.ErrCorruptEntry, "corrupt", bad, want)
			require.Zero(t, sp.commits.Load(), "no batch committed before the bad entry")
			require.Contains(t, err.Error(), fmt.Sprintf("at seq %d: %s", bad, tc.want))
			requireMetric(t, sp.reg, 0, "cgledger_projector_errors_total", "reason", "gap") // a corrupt entry is not a gap

			// Run does not retry a corrupt entry: it returns at once.
			err = sp.Run(ctx)
			require.ErrorIs(t, err, projector.ErrCorruptEntry)
			require.Contains(t, err.Error(), fmt.Sprintf("at seq %d", bad))
			require.Equal(t, bad-1, sp.Applied())
			requireMetric(t, sp.reg, 2, "cgledger_projector_errors_total", "reason", "corrupt")
			requireMetric(t, sp.reg, 0, "cgledger_projector_errors_total", "reason", "nats") // a corrupt entry is not retried as a NATS error

			// A restarted process, with batches that commit before the bad
			// entry this time, stops at the same sequence.
			require.NoError(t, s.Close())
			s = openStore(t, dir)
			defer s.Close()
			batch := 8 + i
			sp = newStopProjector(t, e.JS, s, projector.Config{BatchSize: batch})
			require.Equal(t, bad-1, sp.Applied())
			requireStopped(t, sp, sp.CatchUp(ctx), projector.ErrCorruptEntry, "corrupt", bad, want)

			// A rebuild replays from sequence 1 and stops there again.
			sp = newStopProjector(t, e.JS, s, projector.Config{BatchSize: batch})
			err = sp.Rebuild(ctx)
			requireStopped(t, sp, err, projector.ErrCorruptEntry, "corrupt", bad, want)
			require.NotZero(t, sp.commits.Load(), "batches of %d before seq %d", batch, bad)
		})
	}
}

// gapEnv is a separate server with a stream that, unlike the ledger's,
// allows deletes, so tests can punch holes into the sequence.
type gapEnv struct {
	js     jetstream.JetStream
	stream jetstream.Stream
}

const gapStream = "GAPTEST"

func newGapEnv(t *testing.T) *gapEnv {
	t.Helper()
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	st, err := js.CreateStream(ledgertest.Ctx(t), jetstream.StreamConfig{Name: gapStream, Subjects: []string{"cg.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	return &gapEnv{js: js, stream: st}
}

// publish appends n external wakeups (no CG-Entry-Kind: the projector keeps
// them as external entries) and returns the last sequence.
func (g *gapEnv) publish(t *testing.T, n int) uint64 {
	t.Helper()
	var seq uint64
	for i := range n {
		seq = publishRaw(t, g.js, "cg.v1.p.c.cmd.agent.w.wakeup", nil, fmt.Sprintf("wake-%d", i))
	}
	return seq
}

func (g *gapEnv) delete(t *testing.T, seqs ...uint64) {
	t.Helper()
	for _, seq := range seqs {
		require.NoError(t, g.stream.DeleteMsg(ledgertest.Ctx(t), seq))
	}
}

func (g *gapEnv) state(t *testing.T) jetstream.StreamState {
	t.Helper()
	info, err := g.stream.Info(ledgertest.Ctx(t))
	require.NoError(t, err)
	return info.State
}

// prefixDigests returns, for s in 0..last, the digest of views holding the
// GAPTEST entries 1..s (read before any delete).
func (g *gapEnv) prefixDigests(t *testing.T, last uint64) []string {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	s := openStore(t, filepath.Join(t.TempDir(), "gap-prefix"))
	defer s.Close()
	d := []string{digest(t, s)}
	for seq := uint64(1); seq <= last; seq++ {
		m, err := g.stream.GetMsg(ctx, seq)
		require.NoError(t, err)
		require.NoError(t, projector.ApplyEntries(s, []protocol.Entry{{Seq: m.Sequence, Subject: m.Subject, Headers: m.Header, Data: m.Data, Time: m.Time}}, 1))
		d = append(d, digest(t, s))
	}
	return d
}

// TestGapStopsTheProjector deletes entries from a stream and checks the
// projector refuses to jump over the hole: it stops with ErrGap naming the
// missing sequence, with every entry before the hole committed.
func TestGapStopsTheProjector(t *testing.T) {
	t.Run("hole_in_the_middle", func(t *testing.T) {
		g := newGapEnv(t)
		ctx := ledgertest.Ctx(t)
		last := g.publish(t, 10)
		d := g.prefixDigests(t, last)
		g.delete(t, 6)

		dir := filepath.Join(t.TempDir(), "views")
		s := openStore(t, dir)
		sp := newStopProjector(t, g.js, s, projector.Config{Stream: gapStream, BatchSize: 1000})
		err := sp.CatchUp(ctx)
		requireStopped(t, sp, err, projector.ErrGap, "gap", 6, d[5])
		require.Zero(t, sp.commits.Load(), "the entries before the hole were in the failed batch")
		require.Contains(t, err.Error(), "expected seq 6, got 7")
		requireMetric(t, sp.reg, 0, "cgledger_projector_errors_total", "reason", "corrupt")

		err = sp.Run(ctx)
		require.ErrorIs(t, err, projector.ErrGap, "Run does not retry a gap")
		require.Equal(t, uint64(5), sp.Applied())

		require.NoError(t, s.Close())
		s = openStore(t, dir)
		defer s.Close()
		sp = newStopProjector(t, g.js, s, projector.Config{Stream: gapStream, BatchSize: 2})
		requireStopped(t, sp, sp.CatchUp(ctx), projector.ErrGap, "gap", 6, d[5])
	})

	t.Run("stream_starts_past_a_fresh_store", func(t *testing.T) {
		g := newGapEnv(t)
		g.publish(t, 10)
		g.delete(t, 1, 2, 3)
		require.Equal(t, uint64(4), g.state(t).FirstSeq)

		s := openStore(t, filepath.Join(t.TempDir(), "views"))
		defer s.Close()
		sp := newStopProjector(t, g.js, s, projector.Config{Stream: gapStream})
		err := sp.CatchUp(ledgertest.Ctx(t))
		requireStopped(t, sp, err, projector.ErrGap, "gap", 1, g.prefixDigests(t, 0)[0])
		require.Contains(t, err.Error(), "views end at seq 0 but the stream starts at 4")
		require.Zero(t, sp.commits.Load())
	})

	t.Run("stream_starts_past_the_checkpoint", func(t *testing.T) {
		// The views were at seq 10; entries 11 and 12 then went (age
		// limits, an operator) before the projector saw them.
		g := newGapEnv(t)
		ctx := ledgertest.Ctx(t)
		g.publish(t, 10)
		s := openStore(t, filepath.Join(t.TempDir(), "views"))
		defer s.Close()
		sp := newStopProjector(t, g.js, s, projector.Config{Stream: gapStream})
		require.NoError(t, sp.CatchUp(ctx))
		require.Equal(t, uint64(10), sp.Applied())
		before := digest(t, s)
		g.publish(t, 5)
		g.delete(t, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)

		sp = newStopProjector(t, g.js, s, projector.Config{Stream: gapStream})
		err := sp.CatchUp(ctx)
		requireStopped(t, sp, err, projector.ErrGap, "gap", 11, before)
		require.Contains(t, err.Error(), "views end at seq 10 but the stream starts at 13")
		require.ErrorIs(t, sp.Run(ctx), projector.ErrGap)
	})

	t.Run("every_entry_past_the_checkpoint_gone", func(t *testing.T) {
		// Once every entry after the checkpoint is gone and the stream is
		// empty (all deleted, or all aged out under MaxAge), CatchUp must
		// report the gap rather than wait for entries that will never come.
		g := newGapEnv(t)
		g.publish(t, 5)
		s := openStore(t, filepath.Join(t.TempDir(), "views"))
		defer s.Close()
		sp := newStopProjector(t, g.js, s, projector.Config{Stream: gapStream})
		require.NoError(t, sp.CatchUp(ledgertest.Ctx(t)))
		before := digest(t, s)
		g.publish(t, 3)
		g.delete(t, 1, 2, 3, 4, 5, 6, 7, 8)
		st := g.state(t)
		require.Equal(t, uint64(0), st.Msgs)
		require.Equal(t, uint64(9), st.FirstSeq)

		sp = newStopProjector(t, g.js, s, projector.Config{Stream: gapStream})
		ctx, cancel := context.WithTimeout(ledgertest.Ctx(t), time.Minute)
		defer cancel()
		err := sp.CatchUp(ctx)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "CatchUp hung on an emptied stream")
		requireStopped(t, sp, err, projector.ErrGap, "gap", 6, before)
	})

	t.Run("last_entry_gone", func(t *testing.T) {
		// The stream's last sequence was deleted: CatchUp applies through 9
		// and must report 10 missing rather than wait for it.
		g := newGapEnv(t)
		last := g.publish(t, 10)
		d := g.prefixDigests(t, last)
		g.delete(t, last)
		require.Equal(t, last, g.state(t).LastSeq)

		s := openStore(t, filepath.Join(t.TempDir(), "views"))
		defer s.Close()
		sp := newStopProjector(t, g.js, s, projector.Config{Stream: gapStream})
		ctx, cancel := context.WithTimeout(ledgertest.Ctx(t), time.Minute)
		defer cancel()
		err := sp.CatchUp(ctx)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "CatchUp hung on a stream whose last entry is gone")
		requireStopped(t, sp, err, projector.ErrGap, "gap", last, d[last-1])
	})
}

// TestMetricsPassPromlint lints everything the projector exports after it
// has applied, committed, lagged and stopped on a corrupt entry.
func TestMetricsPassPromlint(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	sp := newStopProjector(t, e.JS, s, projector.Config{BatchSize: 4})
	require.NoError(t, sp.CatchUp(ctx))
	bad := publishRaw(t, e.JS, "cg.v1.proj.main.ledger.report.t.c", kindHeader("report"), "not json")
	require.ErrorIs(t, sp.CatchUp(ctx), projector.ErrCorruptEntry)
	require.Equal(t, bad-1, sp.Applied())

	mfs, err := sp.reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{
		"cgledger_projector_entries_applied_total",
		"cgledger_projector_applied_sequence",
		"cgledger_projector_lag_entries",
		"cgledger_projector_batch_commit_duration_seconds",
		"cgledger_projector_errors_total",
		"cgledger_projector_stalled",
	} {
		require.True(t, names[n], "%s is not exported", n)
	}
	requireMetric(t, sp.reg, float64(bad-1), "cgledger_projector_entries_applied_total")
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	require.NoError(t, err)
	var msgs []string
	for _, p := range problems {
		msgs = append(msgs, p.Metric+": "+p.Text)
	}
	require.Empty(t, problems, strings.Join(msgs, "\n"))
}
