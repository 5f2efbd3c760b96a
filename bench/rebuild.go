package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/stream"
)

// measureRebuild records cfg.Rebuild calls (dispatch, result card, report:
// about five entries each) and then, round after round, measures a raw
// ordered read of the whole ledger stream, the projector rebuilding fresh
// views from it and its floor (the same entries applied from memory), and
// a replay of an export of it and its floor (the entries applied from
// memory while a fresh server stores them raw). All read the same stream
// on the same server, and every run's view digest must be the same.
func measureRebuild(ctx context.Context, e *env, tools *toolWorkload, cfg Config) ([]Row, error) {
	calls, rounds := cfg.Rebuild, cfg.Rounds
	// The process's resident memory as the history grows (serve and the
	// load generator share it; the generator holds at most one chunk).
	start := time.Now()
	nextReport := 0
	memory := func(done int) {
		if done >= nextReport || done == calls {
			rss, heap := residentMB()
			fmt.Fprintf(cfg.Progress, "bench --rebuild: %d calls recorded in %s, RSS %.0f MB, Go heap in use %.0f MB\n", done, time.Since(start).Round(time.Second), rss, heap)
			nextReport += max(calls/10, 1)
		}
	}
	memory(0)
	for done := 0; done < calls; {
		// Small enough chunks that a loaded machine reports every call
		// before its deadline (the reports go last dispatched first).
		n := min(calls-done, 1000)
		if err := recordCalls(ctx, tools, n); err != nil {
			return nil, err
		}
		done += n
		memory(done)
	}
	if cfg.MemProfile != "" {
		if err := writeHeapProfile(cfg.MemProfile); err != nil {
			return nil, fmt.Errorf("--memprofile: %w", err)
		}
	}
	s, err := e.js.Stream(ctx, stream.DefaultName)
	if err != nil {
		return nil, err
	}
	last := s.CachedInfo().State.LastSeq
	// The floors' entries, and the export a replay reads, are made once,
	// outside the timing.
	entries, err := memEntries(ctx, e.js, last)
	if err != nil {
		return nil, fmt.Errorf("read entries into memory: %w", err)
	}
	// They are the bench's, not serve's: serve's memory limit is measured
	// as if they were in another process (heldEntries).
	defer exemptFromMemoryLimit(entries.bytes())()
	fmt.Fprintf(cfg.Progress, "bench --rebuild: %d entries held for the floors in %d MB, outside serve's memory limit\n", entries.len(), entries.bytes()>>20)
	work, err := os.MkdirTemp("", "cgledger-rebuild-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	export := filepath.Join(work, "ledger.export")
	if err := exportStream(ctx, e.js, export); err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	// Every run must end with the same views: a faster path that built
	// other rows would not be measured against its floor.
	want := ""
	same := func(what, digest string) error {
		if want == "" {
			want = digest
		}
		if digest != want {
			return fmt.Errorf("%s: view digest %s differs from %s", what, digest, want)
		}
		return nil
	}
	snaps, snapSeqs, err := snapshotSources(ctx, entries, work)
	if err != nil {
		return nil, err
	}
	var cg, rw, floor, rp, rpFloor []Result
	ready := make([][]Result, len(snaps))
	// timed measures op in a fresh directory under work; op returns the
	// views' digest, computed outside the timing.
	timed := func(what string, op func(dir string) (func() (string, error), error)) (Result, error) {
		dir, err := os.MkdirTemp(work, "run-")
		if err != nil {
			return Result{}, err
		}
		defer os.RemoveAll(dir)
		var digest func() (string, error)
		r, err := measureOnce(last, func() (err error) {
			digest, err = op(dir)
			return err
		})
		if err != nil {
			return r, fmt.Errorf("%s: %w", what, err)
		}
		d, err := digest()
		if err != nil {
			return r, fmt.Errorf("%s: digest: %w", what, err)
		}
		return r, same(what, d)
	}
	ofStore := func(store *projector.Store, err error) (func() (string, error), error) {
		if err != nil {
			return nil, err
		}
		return func() (string, error) { return digestOf(store) }, nil
	}
	for range rounds {
		r, err := measureOnce(last, func() error { return rawRead(ctx, e.js, last) })
		if err != nil {
			return nil, fmt.Errorf("raw read: %w", err)
		}
		rw = append(rw, r)
		if r, err = timed("rebuild", func(dir string) (func() (string, error), error) {
			return ofStore(rebuildViews(ctx, e.js, filepath.Join(dir, "views")))
		}); err != nil {
			return nil, err
		}
		cg = append(cg, r)
		if r, err = timed("rebuild floor", func(dir string) (func() (string, error), error) {
			return ofStore(applyFloor(entries, filepath.Join(dir, "views")))
		}); err != nil {
			return nil, err
		}
		floor = append(floor, r)
		if r, err = timed("replay", func(dir string) (func() (string, error), error) {
			d, err := replayOnce(ctx, export, dir)
			return func() (string, error) { return d, nil }, err
		}); err != nil {
			return nil, err
		}
		rp = append(rp, r)
		if r, err = timed("replay floor", func(dir string) (func() (string, error), error) {
			d, err := replayFloor(ctx, entries, dir)
			return func() (string, error) { return d, nil }, err
		}); err != nil {
			return nil, err
		}
		rpFloor = append(rpFloor, r)
		for i, t := range snaps {
			if r, err = timed("ready from a snapshot", func(dir string) (func() (string, error), error) {
				return ofStore(readyFromSnapshot(ctx, e.js, t, dir))
			}); err != nil {
				return nil, err
			}
			ready[i] = append(ready[i], r)
		}
	}
	rows := []Row{
		withFloor(row(fmt.Sprintf("rebuild %d entries", last), 0, cg, rw), floor),
		withFloor(row(fmt.Sprintf("replay %d entries", last), 0, rp, rw), rpFloor),
	}
	for i := range snaps {
		// Its floor column is the full rebuild: x floor is how many times
		// sooner a fresh replica is ready than by rebuilding (aim >= 10).
		rows = append(rows, withFloor(row(fmt.Sprintf("ready, snapshot@%d", snapSeqs[i]), 0, ready[i], rw), cg))
	}
	return rows, nil
}

// measureOnce times op, which handles n entries.
func measureOnce(n uint64, op func() error) (Result, error) {
	cpu0 := cpuTime()
	start := time.Now()
	if err := op(); err != nil {
		return Result{}, err
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	return Result{Calls: int(n), PerSecond: float64(n) / elapsed.Seconds(),
		P50Ms: float64(elapsed.Microseconds()) / 1000, P99Ms: float64(elapsed.Microseconds()) / 1000,
		CPUMicros: float64(cpu.Microseconds()) / float64(n)}, nil
}

// rawRead reads the ledger stream from sequence 1 to last with an ordered
// consumer, the fastest way JetStream delivers a stream in order.
func rawRead(ctx context.Context, js jetstream.JetStream, last uint64) error {
	s, err := js.Stream(ctx, stream.DefaultName)
	if err != nil {
		return err
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		m, err := it.Next()
		if err != nil {
			return err
		}
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		if meta.Sequence.Stream >= last {
			return nil
		}
	}
}

// rebuildViews builds views from sequence 1 into an empty store, as a
// server does whose views directory was removed.
// It returns the store, open, for its digest.
func rebuildViews(ctx context.Context, js jetstream.JetStream, dir string) (*projector.Store, error) {
	store, err := projector.OpenStore(dir, projector.StoreOptions{})
	if err != nil {
		return nil, err
	}
	p, err := projector.New(store, js, projector.Config{Stream: stream.DefaultName})
	if err == nil {
		err = p.CatchUp(ctx)
	}
	if err == nil {
		err = store.Sync()
	}
	if err != nil {
		store.Close()
		return nil, err
	}
	return store, nil
}

// residentMB is the process's resident set (VmRSS) and the Go heap in use,
// in MB; the RSS is 0 where /proc is not there.
func residentMB() (rss, heap float64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap = float64(ms.HeapInuse) / (1 << 20)
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, heap
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024, heap
		}
	}
	return 0, heap
}

// writeHeapProfile writes a heap profile, after a collection, to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
