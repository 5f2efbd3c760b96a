package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/projector"
)

// benchRebuild records calls calls (dispatch, result card, report: about
// five entries each) and then, round after round, measures a raw ordered
// read of the whole ledger stream against the projector rebuilding fresh
// views from it. Both read the same stream on the same server.
func benchRebuild(ctx context.Context, e *benchEnv, tools *benchTools, calls, rounds int) ([]benchRow, error) {
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
	}
	s, err := e.js.Stream(ctx, ledger.DefaultStream)
	if err != nil {
		return nil, err
	}
	last := s.CachedInfo().State.LastSeq
	var cg, rw []benchResult
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
	return []benchRow{row(fmt.Sprintf("rebuild %d entries", last), 0, cg, rw)}, nil
}

// measureOnce times op, which handles n entries.
func measureOnce(n uint64, op func() error) (benchResult, error) {
	cpu0 := cpuTime()
	start := time.Now()
	if err := op(); err != nil {
		return benchResult{}, err
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	return benchResult{Calls: int(n), PerSecond: float64(n) / elapsed.Seconds(),
		P50Ms: float64(elapsed.Microseconds()) / 1000, P99Ms: float64(elapsed.Microseconds()) / 1000,
		CPUMicros: float64(cpu.Microseconds()) / float64(n)}, nil
}

// rawRead reads the ledger stream from sequence 1 to last with an ordered
// consumer, the fastest way JetStream delivers a stream in order.
func rawRead(ctx context.Context, js jetstream.JetStream, last uint64) error {
	s, err := js.Stream(ctx, ledger.DefaultStream)
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
	p, err := projector.New(store, js, projector.Config{Stream: ledger.DefaultStream})
	if err != nil {
		return err
	}
	if err := p.CatchUp(ctx); err != nil {
		return err
	}
	return store.Sync()
}
