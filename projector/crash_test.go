package projector_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// crashDir is the view directory on the in-memory crash filesystems.
const crashDir = "/views"

// errCrash is what the commit hook returns to stop the projector where a
// kill -9 or a power loss would.
var errCrash = errors.New("simulated crash")

// row is one key/value of a store, copied out of Pebble.
type row struct{ k, v []byte }

// reference is what an uninterrupted projector makes of the test ledger.
type reference struct {
	last     uint64   // the stream's last sequence
	digestAt []string // digestAt[s] is the digest of the views through seq s
	digest   string   // digestAt[last]
	dump     []row    // every row of the views through last
}

// dumpRows copies every row of s out, in key order.
func dumpRows(t *testing.T, s *projector.Store) []row {
	t.Helper()
	var rows []row
	require.NoError(t, s.Dump(func(k, v []byte) error {
		rows = append(rows, row{bytes.Clone(k), bytes.Clone(v)})
		return nil
	}))
	return rows
}

// requireSameRows fails on the first row where got differs from want.
func requireSameRows(t *testing.T, want, got []row, msgAndArgs ...any) {
	t.Helper()
	for i := range min(len(want), len(got)) {
		if !bytes.Equal(want[i].k, got[i].k) || !bytes.Equal(want[i].v, got[i].v) {
			require.FailNow(t, fmt.Sprintf("row %d differs:\nwant %s = %s\ngot  %s = %s",
				i, hex.EncodeToString(want[i].k), hex.EncodeToString(want[i].v),
				hex.EncodeToString(got[i].k), hex.EncodeToString(got[i].v)), msgAndArgs...)
		}
	}
	require.Equal(t, len(want), len(got), append([]any{"row count"}, msgAndArgs...)...)
}

func streamLastSeq(t *testing.T, e *ledgertest.Env) uint64 {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	s, err := e.JS.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return info.State.LastSeq
}

// ledgerEntries reads the whole ledger stream entry by entry.
func ledgerEntries(t *testing.T, e *ledgertest.Env, last uint64) []protocol.Entry {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	st, err := e.JS.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	entries := make([]protocol.Entry, 0, last)
	for seq := uint64(1); seq <= last; seq++ {
		m, err := st.GetMsg(ctx, seq)
		require.NoError(t, err)
		entries = append(entries, protocol.Entry{Seq: m.Sequence, Subject: m.Subject, Headers: m.Header, Data: m.Data, Time: m.Time})
	}
	return entries
}

// buildReference projects the whole ledger with an uninterrupted projector
// on the OS filesystem (the digest and dump every crash run must end with),
// and separately applies it one entry per batch, recording the digest of
// the views through every sequence (what a crash may roll back to).
func buildReference(t *testing.T, e *ledgertest.Env) *reference {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	ref := &reference{last: streamLastSeq(t, e)}
	require.Greater(t, ref.last, uint64(100), "the scenario should make a ledger worth crashing")

	s := openStore(t, filepath.Join(t.TempDir(), "ref"))
	defer s.Close()
	p := newProjector(t, e, s, 16)
	require.NoError(t, p.CatchUp(ctx))
	require.Equal(t, ref.last, p.Applied())
	ref.digest = digest(t, s)
	ref.dump = dumpRows(t, s)
	require.NotEmpty(t, ref.dump)
	// The scenario leaves a call waiting: its open row is among the rows
	// every crash point must come back to.
	require.Len(t, openRows(t, s), 1)

	// The per-sequence digests come from ApplyEntries rather than from a
	// projector with BatchSize 1: a pull consumer buffering two messages
	// stalls for 10 s on a missed heartbeat every few hundred entries under
	// -race (see the report), which would blow the time budget.
	s1 := openStore(t, filepath.Join(t.TempDir(), "ref1"))
	defer s1.Close()
	ref.digestAt = make([]string, 0, ref.last+1)
	ref.digestAt = append(ref.digestAt, digest(t, s1))
	for _, en := range ledgerEntries(t, e, ref.last) {
		require.NoError(t, projector.ApplyEntries(s1, []protocol.Entry{en}, 1))
		ref.digestAt = append(ref.digestAt, digest(t, s1))
	}
	require.Equal(t, ref.digest, ref.digestAt[ref.last], "entry-by-entry views equal the projector's")
	return ref
}

func openCrashStore(t *testing.T, fs vfs.FS) *projector.Store {
	t.Helper()
	s, err := projector.OpenStore(crashDir, projector.StoreOptions{FS: fs})
	require.NoError(t, err)
	return s
}

// newCrashProjector makes a projector committing in batches of batch and
// fsyncing every syncEvery-th batch and the batch that reaches the tail.
func newCrashProjector(t *testing.T, e *ledgertest.Env, s *projector.Store, batch, syncEvery int) *projector.Projector {
	t.Helper()
	p, err := projector.New(s, e.JS, projector.Config{BatchSize: batch, SyncEvery: syncEvery, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	return p
}

// noSync is a SyncEvery that never comes round in these ledgers: only the
// batch reaching the tail is fsynced.
const noSync = 1 << 30

// syncedThrough is the sequence a crash after the n-th commit of a run from
// an empty store (batches of batch, fsync every syncEvery-th) can never roll
// back past: the last fsynced batch, or the tail.
func syncedThrough(n, batch, syncEvery int, last uint64) uint64 {
	if uint64(n*batch) >= last {
		return last
	}
	return uint64(n / syncEvery * syncEvery * batch)
}

// recoverFrom opens a store on fs (the disk as a crash left it), checks that
// the crash only rolled the views back to a consistent checkpoint in
// [lo, hi], catches up and checks the views equal the uninterrupted run's
// byte for byte. It returns the sequence the views were rolled back to.
func recoverFrom(t *testing.T, e *ledgertest.Env, ref *reference, fs vfs.FS, lo, hi uint64, what string) uint64 {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	s := openCrashStore(t, fs)
	defer func() { require.NoError(t, s.Close()) }()
	applied, err := s.Applied()
	require.NoError(t, err)
	require.GreaterOrEqual(t, applied, lo, "%s: views lost synced entries", what)
	require.LessOrEqual(t, applied, hi, "%s: views hold entries past the crash", what)
	require.Equal(t, ref.digestAt[applied], digest(t, s),
		"%s: after the crash the views are not exactly the views through their checkpoint %d", what, applied)

	p := newCrashProjector(t, e, s, 64, 0)
	require.Equal(t, applied, p.Applied(), what)
	require.NoError(t, p.CatchUp(ctx), what)
	require.Equal(t, ref.last, p.Applied(), what)
	require.Equal(t, ref.digest, digest(t, s), "%s: digest after recovery", what)
	requireSameRows(t, ref.dump, dumpRows(t, s), "%s: dump after recovery", what)
	return applied
}

// crashAt runs a projector on a fresh crash filesystem and crashes it right
// after its n-th commit, cloning the disk with pct% of the unsynced writes
// surviving. It returns the clone and the sequence committed at the crash.
func crashAt(t *testing.T, e *ledgertest.Env, batch, syncEvery, n, pct int, rng *rand.Rand) (*vfs.MemFS, uint64) {
	t.Helper()
	fs := vfs.NewCrashableMem()
	s := openCrashStore(t, fs)
	p := newCrashProjector(t, e, s, batch, syncEvery)
	var (
		clone   *vfs.MemFS
		at      uint64
		commits int
	)
	p.SetAfterCommit(func(applied uint64) error {
		commits++
		if commits == n {
			clone = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rng})
			at = applied
			return errCrash
		}
		return nil
	})
	err := p.CatchUp(ledgertest.Ctx(t))
	require.ErrorIs(t, err, errCrash, "crash point %d is past the last commit (%d commits)", n, commits)
	require.Equal(t, at, p.Applied())
	// The dead process's store is closed only to free it; the clone is
	// what the disk held at the crash.
	require.NoError(t, s.Close())
	return clone, at
}

// TestExactlyOnceUnderCrashes crashes the projector (kill -9 / power loss:
// its commits are not fsynced) at every commit point and at random ones,
// with none, some or all of the unsynced writes surviving, then restarts it
// on what the disk held. The views must always come back as a consistent
// checkpoint and catch up to exactly the views of an uninterrupted run.
func TestExactlyOnceUnderCrashes(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 40)
	ref := buildReference(t, e)
	t.Logf("ledger of %d entries, %d view rows", ref.last, len(ref.dump))
	const batch = 3
	commits := int((ref.last + batch - 1) / batch)

	t.Run("every_commit_point", func(t *testing.T) {
		// One run in batches of 3, fsyncing every 10th, clones the disk
		// after every commit, as a
		// crash at that instant would leave it (CrashClone blocks every
		// write while it copies). Whether the process lives on after the
		// clone cannot change the clone, so one run gives every crash point;
		// kill_at_every_commit and random_points below really stop the
		// projector at the crash point.
		rng := rand.New(rand.NewPCG(1, 2))
		type point struct {
			n     int
			at    uint64
			pct   int
			clone *vfs.MemFS
		}
		var points []point
		fs := vfs.NewCrashableMem()
		s := openCrashStore(t, fs)
		const syncEvery = 10
		p := newCrashProjector(t, e, s, batch, syncEvery)
		p.SetAfterCommit(func(applied uint64) error {
			n := len(points) + 1
			pct := 1 + rng.IntN(99)
			switch n % 8 {
			case 0:
				pct = 0
			case 1:
				pct = 100
			}
			points = append(points, point{n, applied, pct, fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rng})})
			return nil
		})
		require.NoError(t, p.CatchUp(ledgertest.Ctx(t)))
		require.NoError(t, s.Close())
		require.Len(t, points, commits)
		for i, pt := range points {
			require.Equal(t, min(uint64((i+1)*batch), ref.last), pt.at, "commit %d", pt.n)
		}
		var rolledBack, kept atomic.Int32
		t.Run("recover", func(t *testing.T) {
			for _, pt := range points {
				t.Run(fmt.Sprintf("commit_%d", pt.n), func(t *testing.T) {
					t.Parallel()
					got := recoverFrom(t, e, ref, pt.clone, syncedThrough(pt.n, batch, syncEvery, ref.last), pt.at, fmt.Sprintf("crash after commit %d (seq %d) keeping %d%% of unsynced writes", pt.n, pt.at, pt.pct))
					if got < pt.at {
						rolledBack.Add(1)
					}
					if got > 0 {
						kept.Add(1)
					}
				})
			}
		})
		t.Logf("%d crash points: %d rolled back, %d kept some entries", len(points), rolledBack.Load(), kept.Load())
		require.NotZero(t, rolledBack.Load(), "no crash lost unsynced commits: the test exercised no rollback")
		require.NotZero(t, kept.Load(), "every crash lost everything: the test exercised no partial recovery")
	})

	t.Run("kill_at_every_commit", func(t *testing.T) {
		// A real stop at every commit point of a run in batches of 8: the
		// hook clones the disk and returns an error, so the projector dies
		// there. (Batches of 8, not 3: see buildReference on tiny pulls.)
		const kb, syncEvery = 8, 4
		rng := rand.New(rand.NewPCG(8, 8))
		for n := 1; n <= int((ref.last+kb-1)/kb); n++ {
			pct := []int{0, 100, rng.IntN(101)}[n%3]
			clone, at := crashAt(t, e, kb, syncEvery, n, pct, rng)
			require.Equal(t, min(uint64(n*kb), ref.last), at)
			recoverFrom(t, e, ref, clone, syncedThrough(n, kb, syncEvery, ref.last), at, fmt.Sprintf("kill after commit %d (seq %d), %d%% of unsynced writes kept", n, at, pct))
		}
	})

	t.Run("random_points", func(t *testing.T) {
		// Kill the projector at a random commit: the hook clones the disk
		// and returns an error, so the process stops right there.
		rng := rand.New(rand.NewPCG(20260101, 7))
		for i := range 12 {
			b := 8 + rng.IntN(40)
			n := 1 + rng.IntN(int((ref.last+uint64(b)-1)/uint64(b)))
			pct := rng.IntN(101)
			se := []int{0, 1, 2 + rng.IntN(6), noSync}[i%4]
			clone, at := crashAt(t, e, b, se, n, pct, rng)
			require.Equal(t, min(uint64(n*b), ref.last), at)
			lo := uint64(0)
			if se > 0 {
				lo = syncedThrough(n, b, se, ref.last)
			}
			recoverFrom(t, e, ref, clone, lo, at, fmt.Sprintf("random crash %d: batch %d, sync every %d, commit %d (seq %d), %d%% of unsynced writes kept", i, b, se, n, at, pct))
		}
	})

	t.Run("repeated_crashes", func(t *testing.T) {
		// Crash, restart on the crashed disk, crash again, ...: recovery
		// from a recovered store is as good as from a fresh one, and with
		// every second batch fsynced each round keeps at least the synced
		// batches it committed, so the projector gets through however
		// often it is killed.
		rng := rand.New(rand.NewPCG(99, 99))
		fs := vfs.NewCrashableMem()
		var applied, atLeast uint64
		for round := 0; ; round++ {
			require.Less(t, round, 40, "no progress across repeated crashes")
			s := openCrashStore(t, fs)
			got, err := s.Applied()
			require.NoError(t, err)
			require.LessOrEqual(t, got, applied, "round %d", round)
			require.GreaterOrEqual(t, got, atLeast, "round %d: the last round's fsynced batches were lost", round)
			require.Equal(t, ref.digestAt[got], digest(t, s), "round %d: views at checkpoint %d", round, got)
			b := 8 + rng.IntN(8)
			p := newCrashProjector(t, e, s, b, 2)
			stopAfter := 2 + rng.IntN(4)
			pct := []int{0, 100, rng.IntN(101)}[round%3]
			var clone *vfs.MemFS
			commitsSeen := 0
			p.SetAfterCommit(func(uint64) error {
				commitsSeen++
				if commitsSeen == stopAfter {
					clone = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rng})
					return errCrash
				}
				return nil
			})
			err = p.CatchUp(ledgertest.Ctx(t))
			applied = p.Applied()
			t.Logf("round %d: restarted at seq %d, stopped at %d (%v), keeping %d%% of unsynced writes", round, got, applied, err, pct)
			require.NoError(t, s.Close())
			if err == nil {
				// Caught up before the crash point.
				require.Equal(t, ref.last, applied)
				break
			}
			require.ErrorIs(t, err, errCrash)
			fs = clone
			// Batches 2, 4, ... of this round were fsynced.
			atLeast = min(got+uint64(stopAfter/2*2*b), ref.last)
		}
		recoverFrom(t, e, ref, fs, ref.last, ref.last, "after repeated crashes")
	})

	t.Run("sync_is_durable", func(t *testing.T) {
		// Store.Sync makes every committed batch durable: a later crash
		// that keeps none of the unsynced writes rolls back no further.
		const sb = 8
		for _, syncAt := range []int{1, 7, int(ref.last/sb) - 4} {
			fs := vfs.NewCrashableMem()
			s := openCrashStore(t, fs)
			p := newCrashProjector(t, e, s, sb, noSync)
			var (
				clone       *vfs.MemFS
				synced, at  uint64
				commitsSeen int
			)
			crashAfter := syncAt + 3
			p.SetAfterCommit(func(applied uint64) error {
				commitsSeen++
				switch commitsSeen {
				case syncAt:
					synced = applied
					return s.Sync()
				case crashAfter:
					at = applied
					clone = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
					return errCrash
				}
				return nil
			})
			require.ErrorIs(t, p.CatchUp(ledgertest.Ctx(t)), errCrash)
			require.NoError(t, s.Close())
			require.NotZero(t, synced)
			what := fmt.Sprintf("sync after commit %d, crash after commit %d", syncAt, crashAfter)
			got := recoverFrom(t, e, ref, clone, synced, at, what)
			require.Less(t, got, at, "%s: no unsynced write was lost, so the check proves nothing", what)
		}

		// The batch that reaches the tail is fsynced: a power loss right
		// after a catch-up loses nothing.
		fs := vfs.NewCrashableMem()
		s := openCrashStore(t, fs)
		p := newCrashProjector(t, e, s, sb, noSync)
		require.NoError(t, p.CatchUp(ledgertest.Ctx(t)))
		clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
		require.NoError(t, s.Close())
		recoverFrom(t, e, ref, clone, ref.last, ref.last, "power loss after a catch-up")
	})

	t.Run("mid_batch_abort", func(t *testing.T) {
		// The hook of one commit cancels the context, so the projector is
		// cut inside the next batch, with entries applied to it but not
		// committed. The store must hold exactly the last commit, on the
		// running disk and after a crash.
		rng := rand.New(rand.NewPCG(5, 5))
		for _, cut := range []int{1, 2, 5, 11} {
			fs := vfs.NewCrashableMem()
			s := openCrashStore(t, fs)
			p := newCrashProjector(t, e, s, 8, noSync)
			ctx, cancel := context.WithCancel(ledgertest.Ctx(t))
			var lastCommit uint64
			commitsSeen := 0
			p.SetAfterCommit(func(applied uint64) error {
				commitsSeen++
				lastCommit = applied
				if commitsSeen == cut {
					cancel()
				}
				return nil
			})
			err := p.CatchUp(ctx)
			cancel()
			require.ErrorIs(t, err, context.Canceled, "cut after commit %d", cut)
			require.Less(t, lastCommit, ref.last, "the cut should leave entries unapplied")
			require.Equal(t, lastCommit, p.Applied(), "cut after commit %d", cut)
			applied, err := s.Applied()
			require.NoError(t, err)
			require.Equal(t, lastCommit, applied, "cut after commit %d: the store's checkpoint", cut)
			require.Equal(t, ref.digestAt[applied], digest(t, s), "cut after commit %d: no part of the cut batch may reach the views", cut)

			// Power loss right after the abort...
			clone := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})
			// ... and, separately, a plain restart on the live disk.
			p2 := newCrashProjector(t, e, s, 8, 0)
			require.Equal(t, lastCommit, p2.Applied())
			require.NoError(t, p2.CatchUp(ledgertest.Ctx(t)))
			require.Equal(t, ref.digest, digest(t, s), "restart after cut %d", cut)
			requireSameRows(t, ref.dump, dumpRows(t, s), "restart after cut %d", cut)
			require.NoError(t, s.Close())

			recoverFrom(t, e, ref, clone, 0, lastCommit, fmt.Sprintf("crash after a cut after commit %d", cut))
		}
	})

	t.Run("during_rebuild", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		const rb = 8
		rbCommits := int((ref.last + rb - 1) / rb)
		for i, n := range []int{1, 2, rbCommits / 2, rbCommits - 1} {
			pct := []int{0, 100, 1 + rng.IntN(99), 1 + rng.IntN(99)}[i]
			fs := vfs.NewCrashableMem()
			s := openCrashStore(t, fs)
			require.NoError(t, newCrashProjector(t, e, s, 512, 0).CatchUp(ledgertest.Ctx(t)))
			require.Equal(t, ref.digest, digest(t, s))
			p := newCrashProjector(t, e, s, rb, 3)
			require.Equal(t, ref.last, p.Applied())
			var (
				clone *vfs.MemFS
				at    uint64
			)
			commitsSeen := 0
			p.SetAfterCommit(func(applied uint64) error {
				commitsSeen++
				if commitsSeen == n {
					at = applied
					clone = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rng})
					return errCrash
				}
				return nil
			})
			require.ErrorIs(t, p.Rebuild(ledgertest.Ctx(t)), errCrash)
			require.Equal(t, min(uint64(n*rb), ref.last), at)
			require.Equal(t, at, p.Applied())
			require.Equal(t, ref.digestAt[at], digest(t, s), "rebuild cut after commit %d: the running views", n)
			require.NoError(t, s.Close())
			// The reset is synced before the rebuild applies anything, so
			// the crash lands inside the rebuild, never before it.
			recoverFrom(t, e, ref, clone, syncedThrough(n, rb, 3, ref.last), at, fmt.Sprintf("crash in a rebuild after commit %d, %d%% of unsynced writes kept", n, pct))
		}
	})
}
