package ledgertest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// WriteCalls writes calls complete calls (dispatch, result card, report)
// from workers goroutines: the ledger the rebuild and replay benchmarks
// measure. Turns have five calls, spread over eight agents with a roster
// entry each, so every report also writes a wakeup: about five entries a
// call. One call in ten fails. It stops the test at the first error.
func (e *Env) WriteCalls(tb testing.TB, ctx context.Context, calls, workers int) {
	tb.Helper()
	const agents = 8
	for a := range agents {
		if _, err := e.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: "agent-" + strconv.Itoa(a), WorkerTarget: "worker-" + strconv.Itoa(a)}); err != nil {
			tb.Fatalf("ledgertest: roster: %v", err)
		}
	}
	tools := []string{"search", "echo", "fetch", "shell"}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	fail := func(err error) { once.Do(func() { firstErr = err }) }
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= calls {
					return
				}
				turn := i / 5
				c := Call{
					Project: "proj", Channel: "main", Agent: "agent-" + strconv.Itoa(turn%agents),
					Turn: fmt.Sprintf("turn-%06d", turn), ID: fmt.Sprintf("call-%06d", i), Epoch: 1, Tool: tools[i%len(tools)],
				}
				status := protocol.StatusSuccess
				if i%10 == 9 {
					status = protocol.StatusFailed
				}
				if _, err := e.L.Dispatch(ctx, c.Dispatch()); err != nil {
					fail(fmt.Errorf("dispatch %s: %w", c.ID, err))
					return
				}
				if _, err := e.L.PutCard(ctx, c.ResultCard(status, `{"n":1}`)); err != nil {
					fail(fmt.Errorf("result card %s: %w", c.ID, err))
					return
				}
				if _, err := e.L.Report(ctx, c.Report(status)); err != nil {
					fail(fmt.Errorf("report %s: %w", c.ID, err))
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		tb.Fatalf("ledgertest: write calls: %v", firstErr)
	}
}

// ReadAll reads entries entries of s from its start with an ordered
// consumer pulling pullMax at a time, touching each entry's data as a
// projector does: the raw read the benchmarks compare with. It returns the
// entries and data bytes read.
func ReadAll(tb testing.TB, ctx context.Context, s jetstream.Stream, entries uint64, pullMax int) (n uint64, size int) {
	tb.Helper()
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		tb.Fatalf("ledgertest: ordered consumer: %v", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(pullMax))
	if err != nil {
		tb.Fatalf("ledgertest: messages: %v", err)
	}
	defer it.Stop()
	for n < entries {
		m, err := it.Next()
		if err != nil {
			tb.Fatalf("ledgertest: raw read after %d entries: %v", n, err)
		}
		size += len(m.Data())
		n++
	}
	return n, size
}
