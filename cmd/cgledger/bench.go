package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	benchpkg "github.com/cgledger/cgledger/bench"
)

const benchHelp = `Measure what a tool call costs against raw JetStream on the same machine, in one
run: a fresh embedded server (credentials on, as serve runs by default) in a temporary
directory, the full serve stack in this process, and a load generator speaking the wire
protocol with a worker credential. For each in-flight level and round it alternates:

  raw      publish a command to a stream, a pull consumer receives it and publishes a
           result to a stream, the caller receives it (the raw JetStream round trip; every
           publish asynchronous, the command acknowledged when its result's ack arrives,
           so results are pipelined as a JetStream user would write it);
  limit    the protocol's own limit, a conformant call on raw JetStream alone: KV create
           of the call key; the tool.call card and the command published together; a
           pull consumer receives the command and publishes the result card and the
           report together (the report with expected-last-subject-sequence 0); a core
           NATS wakeup the caller receives;
  e2e echo      dispatch -> built-in echo executor -> result card -> report -> wakeup
                received -> Inbox consumed;
  e2e echo se   the same with echo registered as side_effectful: the executor records
                the attempt (attempt.start) before running it, the price of the intent;
  e2e external  the same with a tool service in the load generator instead of the
                executor: it pulls its tool.consumer with a tool credential, reads the
                tool.call card, puts the result card and reports over the API.
  mcp echo      an MCP tools/call of echo through serve's /mcp front door (Go SDK client,
                streamable HTTP, a worker's bearer token; dispatch -> echo -> result card
                -> report -> the answer), against the same tools/call of an echo MCP
                server (Go SDK) in this process on loopback: raw is the direct MCP call,
                the ratio the price of the ledger between an MCP client and its tool.
  floor         the ledger's message floor: the messages of one e2e external call
                (requests and replies, appends, KV create, direct get, the keeper's
                hand-back and ack, the projector's deliveries) on raw JetStream alone,
                no parsing or Pebble; msgs counts its ledger side's (docs/performance.md).

Then, at 16 in flight: the report alone (on calls dispatched and given their result card
beforehand) against its floor, an append with expected-last-subject-sequence 0 plus a
core NATS wakeup; and duplicate reports against failing KV creates (the raw cost of
"already there").
--workloads picks some of them by name: echo, echo_se, external, floor, mcp, report,
duplicate (the raw round trip and the protocol limit run with any of the first four).
It prints medians over the rounds and the ratios (cgledger / raw, and for the e2e workloads
cgledger / limit too: calls/s, p99 and CPU per call), with process CPU per call (server and load generator share this
process), messages the ledger's own connections sent the server per call (JetStream
publishes, KV operations, reads, replies, acks; the server's account statistics) and
projector batch commits per call. See BENCHMARKS.md.

--rebuild CALLS measures the views instead: it records CALLS calls (dispatch, result card,
report: about five entries each), then alternates a raw ordered read of the whole ledger
stream, the projector rebuilding fresh views from it (as after the views directory is
removed) and its floor (the same entries applied from memory, without NATS), a replay of an
export of the stream and its floor (the entries applied from memory while a fresh server
stores them raw). It prints entries per second (cg/s, raw/s, floor/s), the time of each
(p50 ms), the CPU per entry and the ratios x raw and x floor; and the time to ready of a
fresh replica restoring a snapshot of all the entries, and one of 90% and catching up the
rest, against the full rebuild (their floor column). Every run must end with the same view digest.

--memory CALLS measures what serve holds as history grows past its retention window: it
records CALLS calls at --rate calls/s (default 1000) against a serve whose retention is
--window / --rate seconds (--window defaults to CALLS/10), so the stream holds about
--window calls at a time and the archiver runs as in serve; every twentieth of the run it
prints the resident memory, the live Go heap after a collection, what the stream holds
and the archive's sealed sequence, then the least-squares slope of RSS and heap in KB per
call over the samples from 2 windows on. With --memprofile DIR, a heap profile per sample
(heap-<calls>.prof) for go tool pprof -base.`

func bench(args []string) int {
	fs := newFlagSet("bench", "bench [--duration 2s] [--rounds 3] [--inflight 1,16,256] [--sync-always] [--retention D] [--json] [--workloads LIST] [--cpuprofile FILE | --cpuprofile-each DIR] [--rebuild CALLS] [--memory CALLS [--window CALLS] [--rate N] [--memprofile DIR]]", benchHelp)
	duration := fs.Duration("duration", 2*time.Second, "length of each measured run")
	rounds := fs.Int("rounds", 3, "rounds per in-flight level (medians are printed)")
	levels := fs.String("inflight", "1,16,256", "comma-separated in-flight levels")
	syncAlways := fs.Bool("sync-always", false, "fsync every JetStream write (the embedded server's --sync-always)")
	asJSON := fs.Bool("json", false, "print JSON")
	workloads := fs.String("workloads", "", "comma-separated workloads to measure, of "+strings.Join(benchpkg.Workloads, ",")+" (default all)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (both sides) to this file")
	cpuProfileEach := fs.String("cpuprofile-each", "", "write one CPU profile per measured cgledger run (not the baselines') into this directory")
	memProfile := fs.String("memprofile", "", "with --rebuild: write a heap profile to this file once the calls are recorded; with --memory: a directory that receives a heap profile per sample")
	retention := fs.String("retention", "", "run serve with this retention window (e.g. 1h): the archiver copies every entry beside the calls, as with serve --retention")
	rebuild := fs.Int("rebuild", 0, "instead of the call workloads: record this many calls (about 5 entries each), then measure the projector rebuilding its views from the stream, and a replay of an export of it, each against its floor (the same entries from memory) and a raw ordered read of the stream")
	memory := fs.Int("memory", 0, "instead of the call workloads: record this many calls at --rate against a serve whose retention holds --window of them, sampling memory, and print the slope past the window")
	window := fs.Int("window", 0, "with --memory: the calls the retention window holds (default a tenth of --memory)")
	rate := fs.Float64("rate", 0, "with --memory: the recording pace in calls per second (default 1000)")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	var inflight []int
	for _, f := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > benchpkg.MaxInFlight {
			return failf(exitUsage, "bench: --inflight: %q is not a number from 1 to 4096", f)
		}
		inflight = append(inflight, n)
	}
	var selected, unknown []string
	for _, w := range strings.Split(*workloads, ",") {
		if w = strings.TrimSpace(w); w == "" {
			continue
		}
		if !slices.Contains(benchpkg.Workloads, w) {
			unknown = append(unknown, strconv.Quote(w))
			continue
		}
		selected = append(selected, w)
	}
	if len(unknown) > 0 {
		return failf(exitUsage, "bench: --workloads: %s not one of %s", strings.Join(unknown, ", "), strings.Join(benchpkg.Workloads, ", "))
	}
	if *rounds < 1 || *duration <= 0 {
		return failf(exitUsage, "bench: --rounds and --duration must be positive")
	}
	if *rebuild < 0 {
		return failf(exitUsage, "bench: --rebuild must be a number of calls")
	}
	if *memory < 0 || *window < 0 || *rate < 0 || ((*window > 0 || *rate > 0) && *memory == 0) {
		return failf(exitUsage, "bench: --memory, --window and --rate are numbers; --window and --rate go with --memory")
	}
	if *memory > 0 && (*rebuild > 0 || *retention != "") {
		return failf(exitUsage, "bench: --memory derives the retention from --window and --rate: not with --rebuild or --retention")
	}
	if *memory > 0 && *memory < 3*max(*window, 1) {
		return failf(exitUsage, "bench: --memory must be at least three --window")
	}
	if d, err := parseDays(*retention); err != nil || d < 0 || (d > 0 && d < time.Second) {
		return failf(exitUsage, "bench: --retention: %q is not a duration of at least 1s", *retention)
	}
	report, err := benchpkg.Run(context.Background(), benchpkg.Config{
		Duration: *duration, Rounds: *rounds, InFlight: inflight, Workloads: selected, SyncAlways: *syncAlways, Retention: *retention,
		Rebuild: *rebuild, CPUProfile: *cpuProfile, CPUProfileEach: *cpuProfileEach, MemProfile: *memProfile, Memory: *memory, Window: *window, Rate: *rate, Progress: os.Stderr, Serve: benchServe,
	})
	if err != nil {
		return failf(exitFailed, "bench: %v", err)
	}
	if *asJSON {
		printJSON(report)
		return exitOK
	}
	if err := report.WriteText(stdout); err != nil {
		return failf(exitFailed, "bench: %v", err)
	}
	return exitOK
}

// benchServe runs serve for the bench: the default settings, data in
// opts.Dir, loopback ports, and a log that goes nowhere.
func benchServe(ctx context.Context, opts benchpkg.ServeOptions, ready func(benchpkg.Server)) error {
	s := defaultSettings()
	s.Data, s.NATSListen, s.HTTPListen, s.SyncAlways, s.Retention = opts.Dir, "127.0.0.1:0", "127.0.0.1:0", opts.SyncAlways, opts.Retention
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	return runServe(ctx, s, quiet, func(sv serving) { ready(benchpkg.Server{NATS: sv.NATS, HTTP: sv.HTTP, Embedded: sv.Embedded}) })
}
