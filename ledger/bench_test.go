package ledger_test

// Benchmarks of the ledger's write paths against a raw JetStream baseline on
// the same embedded server.
//
// Each benchmark has a "ledger" sub-benchmark and raw sub-benchmarks that
// publish the bytes the ledger stores for one operation (data and headers
// copied from entries the ledger wrote during warm-up, Nats-* headers renamed
// so the server ignores them) to a separate stream, RAW_BENCH, with the same
// storage settings:
//
//   - raw_jetstream*:        one raw publish per ledger entry (the "per entry"
//     baseline: a dispatch writes card + command, a report writes
//     report + wakeup, so two publishes per op);
//   - raw_jetstream_onemsg*: one publish carrying the same total bytes (the
//     "per op" baseline).
//
// The raw rows report x_raw = ledger ns/op / that row's ns/op, and the
// parent prints a summary line with both ratios. (The testing package never
// prints metrics of a benchmark that has sub-benchmarks, so the ratio is
// reported on the raw rows rather than on the parent.) Ledger rows also
// report entries/op, B/entry and kv_writes/op measured from stream state, and
// raw rows entries/op and B/entry, to show that the byte counts match.
//
// The ratios depend on the machine; nothing here asserts on timing.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

const (
	rawBenchStream = "RAW_BENCH"
	// rawBenchRoot replaces the ledger's root token in the subject an entry
	// would have, so raw subjects have the ledger's shape (unique card/report
	// subjects, shared command/wakeup subjects) and exact length.
	rawBenchRoot = "rb"
	benchCallID  = "call-1"
	benchWorker  = "worker-1"
	// benchParallelism multiplies GOMAXPROCS for the parallel ledger runs:
	// each goroutine has one synchronous call in flight.
	benchParallelism = 8
	// rawAsyncMaxPending bounds raw PublishAsync acks in flight.
	rawAsyncMaxPending = 4096
	// benchPrepareWorkers dispatches the calls a report benchmark needs.
	benchPrepareWorkers = 8
)

// benchSeq makes turn ids unique across sub-benchmark runs on one server.
var benchSeq atomic.Uint64

// benchTurn returns a fresh turn id of fixed width, so every op of every
// sub-benchmark writes entries of the same size.
func benchTurn(kind byte) string {
	n := strconv.FormatUint(benchSeq.Add(1), 10)
	return string(kind) + "-" + strings.Repeat("0", 10-len(n)) + n
}

// benchEnv is one embedded server with an open ledger and the raw stream.
type benchEnv struct {
	*env
	ctx    context.Context
	js     jetstream.JetStream
	ledger jetstream.Stream
	kv     jetstream.Stream
	raw    jetstream.Stream
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	e := newEnv(b)
	ctx := b.Context()
	js, err := jetstream.New(e.nc)
	require.NoError(b, err)
	ls, err := js.Stream(ctx, e.l.StreamName())
	require.NoError(b, err)
	kv, err := js.Stream(ctx, "KV_"+e.l.BucketName())
	require.NoError(b, err)
	raw, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       rawBenchStream,
		Subjects:   []string{rawBenchRoot + ".>"},
		Retention:  jetstream.LimitsPolicy,
		Storage:    jetstream.FileStorage,
		Replicas:   1,
		Duplicates: stream.DefaultDuplicateWindow,
		MaxMsgSize: stream.DefaultMaxMsgSize,
		MaxBytes:   -1,
		MaxMsgs:    -1,
		Discard:    jetstream.DiscardNew,
	})
	require.NoError(b, err)
	return &benchEnv{env: e, ctx: ctx, js: js, ledger: ls, kv: kv, raw: raw}
}

// rawSubject maps a ledger subject to the raw stream's subject of equal length.
func rawSubject(ledgerSubject string) string {
	return rawBenchRoot + strings.TrimPrefix(ledgerSubject, protocol.Root)
}

// directGetHeaders are added by the server to a direct get's reply; they are
// not part of the stored entry.
var directGetHeaders = map[string]bool{
	"Nats-Stream": true, "Nats-Sequence": true, "Nats-Subject": true, "Nats-Time-Stamp": true,
	"Nats-Last-Sequence": true, "Nats-Num-Pending": true, "Nats-UpTo-Sequence": true,
}

// storedEntry is the data and headers of an entry as the ledger stored it,
// with each published Nats-* header (msg id, publish expectations) renamed to
// Xats-*: the raw baseline is a plain publish, but of the same number of
// bytes.
type storedEntry struct {
	data   []byte
	header nats.Header
}

func (be *benchEnv) sample(b *testing.B, subject string) storedEntry {
	b.Helper()
	m, err := be.ledger.GetLastMsgForSubject(be.ctx, subject)
	require.NoError(b, err, "sample %s", subject)
	h := nats.Header{}
	for k, v := range m.Header {
		if directGetHeaders[k] {
			continue
		}
		if rest, ok := strings.CutPrefix(k, "Nats-"); ok {
			k = "Xats-" + rest
		}
		h[k] = v
	}
	return storedEntry{data: m.Data, header: h}
}

// rawShape is what one ledger op stores: an entry on a subject unique to the
// op (card, report) followed by one on a shared subject (command, wakeup).
type rawShape struct {
	unique        storedEntry
	uniqueSubject func(turn string) string // ledger subject of the unique entry
	fixed         storedEntry
	fixedSubject  string
	merged        storedEntry // both entries' bytes in one message
}

func newRawShape(unique storedEntry, uniqueSubject func(string) string, fixed storedEntry, fixedSubject string) *rawShape {
	h := nats.Header{}
	for _, src := range []nats.Header{unique.header, fixed.header} {
		for k, v := range src {
			h[k] = append(h[k], v...)
		}
	}
	data := append(append([]byte(nil), unique.data...), fixed.data...)
	return &rawShape{
		unique: unique, uniqueSubject: uniqueSubject,
		fixed: fixed, fixedSubject: rawSubject(fixedSubject),
		merged: storedEntry{data: data, header: h},
	}
}

// op publishes one op's worth of raw entries through pub: two messages, or
// one with the same total bytes when single. Header maps are shared; the
// jetstream client does not modify them when no publish options are given.
func (s *rawShape) op(single bool, pub func(*nats.Msg) error) error {
	subj := rawSubject(s.uniqueSubject(benchTurn('x')))
	if single {
		return pub(&nats.Msg{Subject: subj, Data: s.merged.data, Header: s.merged.header})
	}
	if err := pub(&nats.Msg{Subject: subj, Data: s.unique.data, Header: s.unique.header}); err != nil {
		return err
	}
	return pub(&nats.Msg{Subject: s.fixedSubject, Data: s.fixed.data, Header: s.fixed.header})
}

// comparison collects ns/op of the sub-benchmarks of one benchmark. A
// sub-benchmark function runs several times while b.N ramps up; the last
// (final) run's value is kept.
type comparison struct {
	name string
	ns   map[string]float64
	ops  map[string]float64
}

func newComparison(name string) *comparison {
	return &comparison{name: name, ns: map[string]float64{}, ops: map[string]float64{}}
}

type streamState struct{ msgs, bytes, lastSeq uint64 }

func (be *benchEnv) state(b *testing.B, s jetstream.Stream) streamState {
	b.Helper()
	info, err := s.Info(be.ctx)
	require.NoError(b, err)
	return streamState{msgs: info.State.Msgs, bytes: info.State.Bytes, lastSeq: info.State.LastSeq}
}

// measure times loop (everything before it is setup), records ns/op under
// key, and reports what the op stored. entries is the stream the op appends
// to; kv, when set, is the call-record bucket's stream.
func (c *comparison) measure(b *testing.B, be *benchEnv, key string, entries, kv jetstream.Stream, loop func(b *testing.B)) {
	b.Helper()
	before := be.state(b, entries)
	var kvBefore streamState
	if kv != nil {
		kvBefore = be.state(b, kv)
	}
	b.ResetTimer()
	loop(b)
	b.StopTimer()
	elapsed := b.Elapsed()
	if b.Failed() {
		return
	}
	after := be.state(b, entries)
	n := float64(b.N)
	ns := float64(elapsed.Nanoseconds()) / n
	c.ns[key] = ns
	c.ops[key] = n / elapsed.Seconds()
	dm := after.msgs - before.msgs
	b.ReportMetric(float64(dm)/n, "entries/op")
	if dm > 0 {
		b.ReportMetric(float64(after.bytes-before.bytes)/float64(dm), "B/entry")
	}
	if kv != nil {
		b.ReportMetric(float64(be.state(b, kv).lastSeq-kvBefore.lastSeq)/n, "kv_writes/op")
	}
	b.ReportMetric(c.ops[key], "ops/s")
	if l, ok := c.ns["ledger"]; ok && key != "ledger" {
		b.ReportMetric(l/ns, "x_raw")
	}
}

// summary prints ledger ns/op over each raw baseline's ns/op, when all ran.
func (c *comparison) summary(b *testing.B, perEntry, perOp string) {
	b.Helper()
	l, ok1 := c.ns["ledger"]
	e, ok2 := c.ns[perEntry]
	o, ok3 := c.ns[perOp]
	if !ok1 || !ok2 || !ok3 {
		return
	}
	fmt.Printf("ratio %s: ledger %.0f ns/op (%.0f ops/s); per entry: %s %.0f ns/op (%.0f ops/s), ledger/raw = %.2fx; per op: %s %.0f ns/op (%.0f ops/s), ledger/raw = %.2fx\n",
		c.name, l, c.ops["ledger"], perEntry, e, c.ops[perEntry], l/e, perOp, o, c.ops[perOp], l/o)
}

// syncRaw runs b.N raw ops with synchronous publishes.
func (be *benchEnv) syncRaw(shape *rawShape, single bool) func(b *testing.B) {
	pub := func(m *nats.Msg) error {
		_, err := be.js.PublishMsg(be.ctx, m)
		return err
	}
	return func(b *testing.B) {
		for range b.N {
			if err := shape.op(single, pub); err != nil {
				b.Fatalf("raw publish: %v", err)
			}
		}
	}
}

// asyncRaw returns a sub-benchmark that runs b.N raw ops with PublishAsync,
// up to rawAsyncMaxPending acks in flight, and waits for every ack.
func (be *benchEnv) asyncRaw(c *comparison, key string, shape *rawShape, single bool) func(b *testing.B) {
	return func(b *testing.B) {
		var (
			mu       sync.Mutex
			failed   int
			firstErr error
		)
		js, err := jetstream.New(be.nc,
			jetstream.WithPublishAsyncMaxPending(rawAsyncMaxPending),
			jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
				mu.Lock()
				defer mu.Unlock()
				if failed++; firstErr == nil {
					firstErr = err
				}
			}))
		require.NoError(b, err)
		pub := func(m *nats.Msg) error {
			_, err := js.PublishMsgAsync(m)
			return err
		}
		c.measure(b, be, key, be.raw, nil, func(b *testing.B) {
			for range b.N {
				if err := shape.op(single, pub); err != nil {
					b.Fatalf("raw publish async: %v", err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatalf("raw publish async: %d acks still pending after a minute", js.PublishAsyncPending())
			}
		})
		mu.Lock()
		defer mu.Unlock()
		if failed > 0 {
			b.Fatalf("raw publish async: %d publishes failed, first: %v", failed, firstErr)
		}
	}
}

// dispatchShape dispatches one call and returns the raw shape of what the
// ledger stored for it.
func (be *benchEnv) dispatchShape(b *testing.B) *rawShape {
	b.Helper()
	c := newCall(benchTurn('w'), benchCallID, 1)
	_, err := be.l.Dispatch(be.ctx, c.dispatchReq())
	require.NoError(b, err)
	cmdSubject := protocol.ToolCommandSubject("v1", project, channel, "echo")
	return newRawShape(
		be.sample(b, protocol.CardSubject("v1", project, c.card.CardID)),
		// Card ids follow newCall's scheme, so raw subjects have the same length.
		func(turn string) string { return protocol.CardSubject("v1", project, "cc-"+turn+"-"+benchCallID) },
		be.sample(b, cmdSubject), cmdSubject)
}

// reportShape sets a roster entry (so reports wake a worker), reports one
// call and returns the raw shape of what the report stored.
func (be *benchEnv) reportShape(b *testing.B) *rawShape {
	b.Helper()
	_, err := be.l.SetRoster(be.ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: benchWorker})
	require.NoError(b, err)
	reqs := be.prepareReports(b, 1)
	out, err := be.l.Report(be.ctx, reqs[0])
	require.NoError(b, err)
	require.False(b, out.Wakeup.Skipped)
	return newRawShape(
		be.sample(b, protocol.ReportSubject("v1", project, channel, reqs[0].Identity.AgentTurnID, benchCallID)),
		func(turn string) string { return protocol.ReportSubject("v1", project, channel, turn, benchCallID) },
		be.sample(b, out.Wakeup.Subject), out.Wakeup.Subject)
}

// prepareReports dispatches n calls and stores their result cards (setup,
// not timed), and returns the report request of each.
func (be *benchEnv) prepareReports(b *testing.B, n int) []protocol.ReportRequest {
	b.Helper()
	reqs := make([]protocol.ReportRequest, n)
	calls := make([]call, n)
	for i := range calls {
		calls[i] = newCall(benchTurn('r'), benchCallID, 1)
		reqs[i] = calls[i].reportReq(protocol.StatusSuccess, calls[i].resultCard(protocol.StatusSuccess).CardID)
	}
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		errMu sync.Mutex
		first error
	)
	for range min(benchPrepareWorkers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				c := calls[i]
				req := c.dispatchReq()
				// A long setup must not leave the first calls past
				// their deadline (their reports would be late).
				req.Payload.TimeoutMS = 24 * 3600 * 1000
				_, err := be.l.Dispatch(be.ctx, req)
				if err == nil {
					_, err = be.l.PutCard(be.ctx, c.resultCard(protocol.StatusSuccess))
				}
				if err != nil {
					errMu.Lock()
					if first == nil {
						first = fmt.Errorf("prepare call %s: %w", c.turn, err)
					}
					errMu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(b, first)
	return reqs
}

// BenchmarkDispatch measures Dispatch of distinct calls, one at a time,
// against synchronous raw publishes of the same bytes.
func BenchmarkDispatch(b *testing.B) {
	be := newBenchEnv(b)
	shape := be.dispatchShape(b)
	c := newComparison("BenchmarkDispatch")
	b.Run("ledger", func(b *testing.B) {
		c.measure(b, be, "ledger", be.ledger, be.kv, func(b *testing.B) {
			for range b.N {
				if _, err := be.l.Dispatch(be.ctx, newCall(benchTurn('d'), benchCallID, 1).dispatchReq()); err != nil {
					b.Fatalf("dispatch: %v", err)
				}
			}
		})
	})
	b.Run("raw_jetstream", func(b *testing.B) {
		c.measure(b, be, "raw_jetstream", be.raw, nil, be.syncRaw(shape, false))
	})
	b.Run("raw_jetstream_onemsg", func(b *testing.B) {
		c.measure(b, be, "raw_jetstream_onemsg", be.raw, nil, be.syncRaw(shape, true))
	})
	c.summary(b, "raw_jetstream", "raw_jetstream_onemsg")
}

// BenchmarkReport measures Report of dispatched calls whose result cards are
// already stored (dispatch and card put are setup), one at a time, against
// synchronous raw publishes of the report and wakeup entries' bytes.
func BenchmarkReport(b *testing.B) {
	be := newBenchEnv(b)
	shape := be.reportShape(b)
	c := newComparison("BenchmarkReport")
	b.Run("ledger", func(b *testing.B) {
		reqs := be.prepareReports(b, b.N)
		c.measure(b, be, "ledger", be.ledger, be.kv, func(b *testing.B) {
			for i := range b.N {
				out, err := be.l.Report(be.ctx, reqs[i])
				if err != nil {
					b.Fatalf("report: %v", err)
				}
				if out.Duplicate {
					b.Fatalf("report %d: unexpected duplicate", i)
				}
			}
		})
	})
	b.Run("raw_jetstream", func(b *testing.B) {
		c.measure(b, be, "raw_jetstream", be.raw, nil, be.syncRaw(shape, false))
	})
	b.Run("raw_jetstream_onemsg", func(b *testing.B) {
		c.measure(b, be, "raw_jetstream_onemsg", be.raw, nil, be.syncRaw(shape, true))
	})
	c.summary(b, "raw_jetstream", "raw_jetstream_onemsg")
}

// BenchmarkDispatchParallel measures Dispatch throughput with
// benchParallelism*GOMAXPROCS concurrent callers against raw PublishAsync
// throughput with many acks in flight.
func BenchmarkDispatchParallel(b *testing.B) {
	be := newBenchEnv(b)
	shape := be.dispatchShape(b)
	c := newComparison("BenchmarkDispatchParallel")
	b.Run("ledger", func(b *testing.B) {
		b.SetParallelism(benchParallelism)
		c.measure(b, be, "ledger", be.ledger, be.kv, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := be.l.Dispatch(be.ctx, newCall(benchTurn('d'), benchCallID, 1).dispatchReq()); err != nil {
						b.Errorf("dispatch: %v", err)
						return
					}
				}
			})
		})
	})
	b.Run("raw_jetstream_async", be.asyncRaw(c, "raw_jetstream_async", shape, false))
	b.Run("raw_jetstream_async_onemsg", be.asyncRaw(c, "raw_jetstream_async_onemsg", shape, true))
	c.summary(b, "raw_jetstream_async", "raw_jetstream_async_onemsg")
}

// BenchmarkReportParallel measures Report throughput with
// benchParallelism*GOMAXPROCS concurrent reporters against raw PublishAsync
// throughput with many acks in flight.
func BenchmarkReportParallel(b *testing.B) {
	be := newBenchEnv(b)
	shape := be.reportShape(b)
	c := newComparison("BenchmarkReportParallel")
	b.Run("ledger", func(b *testing.B) {
		reqs := be.prepareReports(b, b.N)
		var next atomic.Int64
		b.SetParallelism(benchParallelism)
		c.measure(b, be, "ledger", be.ledger, be.kv, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := next.Add(1) - 1
					out, err := be.l.Report(be.ctx, reqs[i])
					if err == nil && out.Duplicate {
						err = fmt.Errorf("unexpected duplicate")
					}
					if err != nil {
						b.Errorf("report %d: %v", i, err)
						return
					}
				}
			})
		})
	})
	b.Run("raw_jetstream_async", be.asyncRaw(c, "raw_jetstream_async", shape, false))
	b.Run("raw_jetstream_async_onemsg", be.asyncRaw(c, "raw_jetstream_async_onemsg", shape, true))
	c.summary(b, "raw_jetstream_async", "raw_jetstream_async_onemsg")
}
