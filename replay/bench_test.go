package replay_test

// BenchmarkReplay measures replay against the raw JetStream floors of its two
// halves, measured in the same run on the same machine, so replay can be
// reported as a ratio to raw JetStream rather than as an absolute figure.
//
// Setup (untimed) writes a real ledger through ledgertest (replayCalls calls,
// each a dispatch, a result card and a report: card + command + result card
// + report + wakeup entries, so ~5 entries a call; override the size with
// CGLEDGER_BENCH_REPLAY_CALLS), exports it with the ledger's own Export (the
// file `cgledger export` writes) and reads the file back into memory. Then:
//
//   - replay:            replay.Run on the file, end to end: a fresh embedded
//     server and Pebble store, one streaming read of the file with chain
//     verification, pipelined imports (1024 in flight), the projector
//     following, the final sync and digest. Server start and stop are inside
//     the timer, as they are part of what a replay costs.
//   - raw_async_publish: the same entries (subject, headers, data; Nats-*
//     headers dropped as the import does) published with PublishMsgAsync, at
//     most 1024 in flight, into a fresh server's stream provisioned exactly as
//     the ledger's, until every ack is in. Only the publishes are timed: the
//     floor of replay's import half.
//   - raw_ordered_read:  an ordered consumer reading every entry of a stream
//     holding them: the floor of any reader, and what the aim "replay >= 0.3x
//     raw ordered read" is stated against.
//
// Each reports entries/s and entries/op; the parent prints the ratios of the
// last run of each. Every sub-benchmark checks it did the whole job (entry
// counts, chain head), but nothing here asserts on timing.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/replay"
	"github.com/cgledger/cgledger/stream"
)

const (
	// replayCalls is the default ledger size: ~10k entries, small enough for
	// `go test -bench . -benchtime 1x`.
	replayCalls = 2000
	// replayWorkers write the ledger concurrently (outside the timer).
	replayWorkers = 16
	// rawInFlight bounds the raw publishes awaiting their ack, as the
	// import's default window does.
	rawInFlight = 1024
	// rawPullMax matches the projector's default pull size (2 x BatchSize).
	rawPullMax = 2 * 512
)

// BenchmarkReplay compares replay.Run with raw JetStream publishes and reads
// of the same entries.
func BenchmarkReplay(b *testing.B) {
	calls := replayCalls
	if v := os.Getenv("CGLEDGER_BENCH_REPLAY_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("CGLEDGER_BENCH_REPLAY_CALLS=%q: want a positive number of calls", v)
		}
		calls = n
	}
	ctx := b.Context()
	start := time.Now()
	e := ledgertest.New(b)
	e.WriteCalls(b, ctx, calls, replayWorkers)
	file := filepath.Join(b.TempDir(), "ledger.export")
	f, err := os.Create(file)
	require.NoError(b, err)
	tr, err := e.L.Export(ctx, f, 0)
	require.NoError(b, err)
	require.NoError(b, f.Close())
	msgs := readMsgs(b, file)
	entries := tr.Count
	require.Equal(b, tr.LastSeq, entries, "a full export of a stream without gaps")
	require.Equal(b, uint64(len(msgs)), entries)
	fi, err := os.Stat(file)
	require.NoError(b, err)
	fmt.Printf("BenchmarkReplay: ledger of %d calls, %d entries, export file %.1f MiB, set up in %v\n",
		calls, entries, float64(fi.Size())/(1<<20), time.Since(start).Round(time.Millisecond))

	var replayRate, pubRate, readRate float64
	b.Run("replay", func(b *testing.B) {
		root := b.TempDir()
		n := 0
		var cpu time.Duration
		for b.Loop() {
			n++
			dir := filepath.Join(root, strconv.Itoa(n))
			c0 := processCPU(b)
			res, err := replay.Run(b.Context(), file, replay.Options{Dir: dir})
			cpu += processCPU(b) - c0

			b.StopTimer()
			require.NoError(b, err)
			require.True(b, res.File.OK, "the export verifies")
			require.Equal(b, entries, res.Entries)
			require.Equal(b, entries, res.AppliedSeq)
			require.Equal(b, tr.Head, res.ChainHead)
			require.NoError(b, os.RemoveAll(dir))
			b.StartTimer()
		}
		replayRate = report(b, entries)
		b.ReportMetric(float64(cpu.Microseconds())/float64(entries)/float64(b.N), "cpu-us/entry")
	})
	b.Run("raw_async_publish", func(b *testing.B) {
		root := b.TempDir()
		n := 0
		var cpu time.Duration
		for b.Loop() {
			b.StopTimer()
			n++
			dir := filepath.Join(root, strconv.Itoa(n))
			raw := startRaw(b, dir)
			b.StartTimer()

			c0 := processCPU(b)
			publishAll(b, raw.js, msgs)
			cpu += processCPU(b) - c0

			b.StopTimer()
			require.Equal(b, entries, raw.msgs(b))
			raw.stop()
			require.NoError(b, os.RemoveAll(dir))
			b.StartTimer()
		}
		pubRate = report(b, entries)
		b.ReportMetric(float64(cpu.Microseconds())/float64(entries)/float64(b.N), "cpu-us/entry")
	})
	b.Run("raw_ordered_read", func(b *testing.B) {
		raw := startRaw(b, b.TempDir())
		defer raw.stop()
		publishAll(b, raw.js, msgs)
		require.Equal(b, entries, raw.msgs(b))
		for b.Loop() {
			if n, size := ledgertest.ReadAll(b, b.Context(), raw.s, entries, rawPullMax); n != entries || size == 0 {
				b.Fatalf("raw read %d entries (%d bytes), want %d", n, size, entries)
			}
		}
		readRate = report(b, entries)
	})
	if replayRate > 0 && pubRate > 0 && readRate > 0 {
		fmt.Printf("BenchmarkReplay: %d entries: replay %.0f entries/s, raw async publish %.0f entries/s, raw ordered read %.0f entries/s: "+
			"replay/raw_read = %.2fx (aim >= 0.3x), replay/raw_publish = %.2fx, raw_publish/raw_read = %.2fx\n",
			entries, replayRate, pubRate, readRate, replayRate/readRate, replayRate/pubRate, pubRate/readRate)
	}
}

// report reports entries/s and entries/op for a sub-benchmark that handled
// entries entries per operation, and returns the rate. (The testing package
// never prints metrics of a benchmark that has sub-benchmarks, so they are
// reported on the sub-benchmarks.)
func report(b *testing.B, entries uint64) float64 {
	rate := float64(entries) * float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(rate, "entries/s")
	b.ReportMetric(float64(entries), "entries/op")
	return rate
}

// readMsgs reads the export file back with the ledger's reader and returns
// its entries as the messages the import publishes: same subject, headers
// and data, without JetStream's own Nats-* headers.
func readMsgs(b *testing.B, file string) []*nats.Msg {
	b.Helper()
	f, err := os.Open(file)
	require.NoError(b, err)
	defer f.Close()
	var msgs []*nats.Msg
	_, tr, err := stream.ReadExport(f, nil, func(e stream.ExportEntry) error {
		m := &nats.Msg{Subject: e.Subject, Data: e.Data, Header: nats.Header{}}
		for k, v := range e.Headers {
			if !strings.HasPrefix(strings.ToLower(k), "nats-") {
				m.Header[k] = v
			}
		}
		msgs = append(msgs, m)
		return nil
	})
	require.NoError(b, err)
	require.NotNil(b, tr, "the export has its trailer")
	return msgs
}

// rawServer is a fresh embedded JetStream server (as replay starts one)
// with the ledger's streams provisioned and nothing else.
type rawServer struct {
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	s   jetstream.Stream
}

// startRaw starts a rawServer storing in dir.
func startRaw(b *testing.B, dir string) *rawServer {
	b.Helper()
	srv, err := natsserver.Start(natsserver.Config{StoreDir: dir, ServerName: "cgledger-bench-raw"})
	require.NoError(b, err)
	r := &rawServer{srv: srv}
	b.Cleanup(r.stop)
	r.nc, err = nats.Connect("nats://" + srv.Addr().String())
	require.NoError(b, err)
	r.js, err = jetstream.New(r.nc, jetstream.WithPublishAsyncMaxPending(rawInFlight))
	require.NoError(b, err)
	require.NoError(b, stream.Provision(b.Context(), r.js, stream.Config{}))
	r.s, err = r.js.Stream(b.Context(), stream.DefaultName)
	require.NoError(b, err)
	return r
}

// msgs returns the number of entries the ledger stream holds.
func (r *rawServer) msgs(b *testing.B) uint64 {
	b.Helper()
	info, err := r.s.Info(b.Context())
	require.NoError(b, err)
	return info.State.Msgs
}

// stop closes the connection and shuts the server down; a second call does
// nothing.
func (r *rawServer) stop() {
	if r.srv == nil {
		return
	}
	if r.nc != nil {
		r.nc.Close()
	}
	r.srv.Shutdown()
	r.srv.WaitForShutdown()
	r.srv = nil
}

// publishAll publishes msgs with PublishMsgAsync (the js context bounds the
// acks awaited) and waits until every ack is in.
func publishAll(b *testing.B, js jetstream.JetStream, msgs []*nats.Msg) {
	b.Helper()
	for _, m := range msgs {
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatalf("publish %s: %v", m.Subject, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-b.Context().Done():
		b.Fatal(b.Context().Err())
	}
}

// processCPU is the CPU time (user and system) the process has used: the
// server, the ledger and the replay all run in it.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
