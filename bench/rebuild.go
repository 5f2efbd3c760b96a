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
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/stream"
)

// measureRebuild records cfg.Rebuild calls (dispatch, result card, report: about
// five entries each) and then, round after round, measures a raw ordered
// read of the whole ledger stream against the projector rebuilding fresh
// views from it. Both read the same stream on the same server.
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
		n := min(calls-done, 5000)
		if err := tools.prepare(ctx, n, 128); err != nil {
			return nil, err
		}
		var wg sync.WaitGroup
		errs := make(chan error, 128)
		for range 128 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					err := tools.report(ctx)
					if err == errPoolEmpty {
						return
					}
					if err != nil {
						select {
						case errs <- err:
						default:
						}
						return
					}
				}
			}()
		}
		wg.Wait()
		select {
		case err := <-errs:
			return nil, fmt.Errorf("record calls: %w", err)
		default:
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
	var cg, rw []Result
	for range rounds {
		r, err := measureOnce(last, func() error { return rawRead(ctx, e.js, last) })
		if err != nil {
			return nil, fmt.Errorf("raw read: %w", err)
		}
		rw = append(rw, r)
		dir, err := os.MkdirTemp("", "cgledger-rebuild-")
		if err != nil {
			return nil, err
		}
		r, err = measureOnce(last, func() error { return rebuildViews(ctx, e.js, filepath.Join(dir, "views")) })
		os.RemoveAll(dir)
		if err != nil {
			return nil, fmt.Errorf("rebuild: %w", err)
		}
		cg = append(cg, r)
	}
	return []Row{row(fmt.Sprintf("rebuild %d entries", last), 0, cg, rw)}, nil
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
func rebuildViews(ctx context.Context, js jetstream.JetStream, dir string) error {
	store, err := projector.OpenStore(dir, projector.StoreOptions{})
	if err != nil {
		return err
	}
	defer store.Close()
	p, err := projector.New(store, js, projector.Config{Stream: stream.DefaultName})
	if err != nil {
		return err
	}
	if err := p.CatchUp(ctx); err != nil {
		return err
	}
	return store.Sync()
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
