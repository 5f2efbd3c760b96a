package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// credentialTTL is how long the load generator's credentials last: longer
// than any run (a 1M-call --rebuild records for most of an hour on a
// loaded 2-core machine, and an expired credential ends the run with
// "authentication expired").
const credentialTTL = 7 * 24 * time.Hour

// env is the server under test and the clients that load it.
type env struct {
	httpURL string
	srv     *server.Server
	// ledgerAccount is the account whose traffic is counted.
	ledgerAccount string
	worker        *nats.Conn
	admin         *nats.Conn
	js            jetstream.JetStream // the ledger account (raw baselines, counters)
	cl            *client.Client
	// profileDir is Config.CPUProfileEach; profiles counts its files.
	profileDir string
	profiles   int

	waiters waiters
	seq     atomic.Int64
}

// Run validates cfg, runs the bench and returns its report. The stack it
// measures runs in a temporary directory removed at the end.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, fmt.Errorf("config: %w", err)
	}
	cfg = cfg.withDefaults()
	if cfg.CPUProfile != "" && cfg.CPUProfileEach != "" {
		return Report{}, errors.New("--cpuprofile and --cpuprofile-each: one profile at a time")
	}
	if cfg.CPUProfileEach != "" {
		// Made (or refused) before anything runs, not at the first profile.
		if err := os.MkdirAll(cfg.CPUProfileEach, 0o755); err != nil {
			return Report{}, fmt.Errorf("--cpuprofile-each: %w", err)
		}
	}
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return Report{}, fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return Report{}, fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	var mem *MemoryReport
	rows, err := run(ctx, cfg, &mem)
	if err != nil {
		return Report{}, err
	}
	return Report{Duration: cfg.Duration.String(), Retention: cfg.Retention, Rounds: cfg.Rounds, Rows: rows, SyncAlways: cfg.SyncAlways, Memory: mem}, nil
}

// run starts the stack and measures every workload, or with cfg.Memory
// the memory, into *mem.
func run(ctx context.Context, cfg Config, mem **MemoryReport) ([]Row, error) {
	d, rounds, inflight := cfg.Duration, cfg.Rounds, cfg.InFlight
	dir, err := os.MkdirTemp("", "cgledger-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan Server, 1)
	served := make(chan error, 1)
	go func() {
		served <- cfg.Serve(ctx, ServeOptions{Dir: dir, SyncAlways: cfg.SyncAlways, Retention: cfg.Retention}, func(sv Server) { ready <- sv })
	}()
	var a Server
	select {
	case a = <-ready:
	case err := <-served:
		return nil, fmt.Errorf("serve: %w", err)
	case <-time.After(time.Minute):
		return nil, errors.New("serve did not start within a minute")
	}
	defer func() {
		cancel()
		<-served
	}()
	is, err := auth.LoadIssuer(filepath.Join(dir, "auth"))
	if err != nil {
		return nil, err
	}
	connect := func(g auth.Grant) (*nats.Conn, error) {
		c, err := is.Issue(g, credentialTTL, time.Now())
		if err != nil {
			return nil, err
		}
		opts := []nats.Option{nats.UserJWTAndSeed(c.JWT, c.Seed), nats.Name("cgledger-bench")}
		if g.Role != auth.RoleLedger {
			opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
		}
		return nats.Connect(a.NATS, opts...)
	}
	e := &env{httpURL: a.HTTP, srv: a.Embedded, profileDir: cfg.CPUProfileEach}
	if e.worker, err = connect(auth.Grant{Role: auth.RoleWorker, Project: "bench"}); err != nil {
		return nil, err
	}
	defer e.worker.Close()
	if e.admin, err = connect(auth.Grant{Role: auth.RoleAdmin, Project: auth.AllProjects}); err != nil {
		return nil, err
	}
	defer e.admin.Close()
	ln, err := connect(auth.Grant{Role: auth.RoleLedger, Label: "bench raw baseline"})
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	if e.js, err = jetstream.New(ln); err != nil {
		return nil, err
	}
	e.cl = client.New(e.worker)
	if k, err := auth.LoadAccountKeys(filepath.Join(dir, "auth")); err == nil {
		e.ledgerAccount, _ = k.Account.PublicKey()
	}
	if err := e.setup(ctx); err != nil {
		return nil, err
	}
	raw, err := newRawWorkload(ctx, e.js)
	if err != nil {
		return nil, err
	}
	defer raw.close()

	// alternate measures the raw baseline and the cgledger side by turns,
	// so both see the same machine.
	alternate := func(workload string, n int, rawOp, cgOp func(context.Context) error) (Row, error) {
		var cg, rw []Result
		for range rounds {
			r, err := e.measure(ctx, workload, d, n, rawOp, false)
			if err != nil {
				return Row{}, err
			}
			rw = append(rw, r)
			if r, err = e.measure(ctx, workload, d, n, cgOp, true); err != nil {
				return Row{}, err
			}
			cg = append(cg, r)
		}
		return row(workload, n, cg, rw), nil
	}
	tools, err := newToolWorkload(ctx, e, connect)
	if err != nil {
		return nil, err
	}
	defer tools.close()
	if cfg.Rebuild > 0 {
		return measureRebuild(ctx, e, tools, cfg)
	}
	if cfg.Memory > 0 {
		*mem, err = measureMemory(ctx, e, tools, cfg)
		return nil, err
	}
	external := func(ctx context.Context) error { return e.callTool(ctx, extTool) }
	sideEffect := func(ctx context.Context) error { return e.callTool(ctx, sideEffectTool) }
	want := func(w string) bool { return slices.Contains(cfg.Workloads, w) }
	// Whole calls: per level and round, the raw round trip, the protocol
	// limit, the ledger's message floor and the selected call workloads by
	// turns; every call workload (and the floor) is compared with the same
	// two baselines.
	type callWorkload struct {
		name, label string
		op          func(context.Context) error
	}
	calls := slices.DeleteFunc([]callWorkload{{"echo", "e2e echo", e.call}, {"echo_se", "e2e echo se", sideEffect}, {"external", "e2e external", external}},
		func(c callWorkload) bool { return !want(c.name) })
	callRows := make([][]Row, len(calls))
	var floor *floorWorkload
	var floorRows []Row
	if want("floor") {
		if floor, err = newFloorWorkload(ctx, e, connect); err != nil {
			return nil, fmt.Errorf("message floor: %w", err)
		}
		defer floor.close()
	}
	for _, n := range inflight {
		if len(calls) == 0 && floor == nil {
			break
		}
		var rw, lim, fl []Result
		got := make([][]Result, len(calls))
		for range rounds {
			raw.resultsInFlight()
			r, err := e.measure(ctx, "raw", d, n, raw.call, false)
			if err != nil {
				return nil, fmt.Errorf("raw round trip: %w", err)
			}
			r.ResultsInFlight = raw.resultsInFlight()
			rw = append(rw, r)
			if r, err = e.measure(ctx, "limit", d, n, raw.protocolLimit, false); err != nil {
				return nil, fmt.Errorf("protocol limit: %w", err)
			}
			lim = append(lim, r)
			if floor != nil {
				sent := floor.sent()
				if r, err = e.measure(ctx, "floor", d, n, floor.call, false); err != nil {
					return nil, fmt.Errorf("message floor: %w", err)
				}
				r.LedgerMsgs = float64(floor.sent()-sent) / float64(r.Calls)
				fl = append(fl, r)
			}
			for i, c := range calls {
				if r, err = e.measure(ctx, c.name, d, n, c.op, true); err != nil {
					return nil, fmt.Errorf("%s: %w", c.label, err)
				}
				got[i] = append(got[i], r)
			}
		}
		if floor != nil {
			floorRows = append(floorRows, withLimit(row("floor", n, fl, rw), lim))
		}
		for i, c := range calls {
			callRows[i] = append(callRows[i], withLimit(row(c.label, n, got[i], rw), lim))
		}
	}
	rows := floorRows
	for _, rs := range callRows {
		rows = append(rows, rs...)
	}
	if want("mcp") {
		// The MCP front door: a tools/call of echo through /mcp beside the
		// same call of an echo MCP server in this process.
		mb, err := newMCPWorkload(ctx, a.HTTP, func(g auth.Grant) (string, error) {
			c, err := is.Issue(g, credentialTTL, time.Now())
			return c.JWT, err
		})
		if err != nil {
			return nil, err
		}
		defer mb.close()
		for _, n := range inflight {
			r, err := alternate("mcp echo", n, mb.direct.call, mb.front.call)
			if err != nil {
				return nil, fmt.Errorf("mcp echo: %w", err)
			}
			rows = append(rows, r)
		}
	}
	if want("report") {
		// The report alone, on calls dispatched and given their result card
		// beforehand, against its protocol floor: an append with
		// expected-last-subject-sequence 0 and a core NATS wakeup.
		var reports []Result
		var rawReports []Result
		for range rounds {
			r, err := e.measure(ctx, "report", d, 16, raw.report, false)
			if err != nil {
				return nil, err
			}
			rawReports = append(rawReports, r)
			// Enough prepared calls for the round at the raw side's rate
			// (the ledger's is lower), within memory.
			if err := tools.prepare(ctx, min(20000, max(200, int(r.PerSecond*d.Seconds()/4))), 64); err != nil {
				return nil, err
			}
			if r, err = e.measure(ctx, "report", d, 16, tools.report, true); err != nil {
				return nil, err
			}
			reports = append(reports, r)
		}
		rows = append(rows, row("report", 16, reports, rawReports))
	}
	if want("duplicate") {
		// Duplicates: a repeated report against a KV create of an existing key.
		dup, err := e.duplicateReport(ctx)
		if err != nil {
			return nil, err
		}
		r, err := alternate("duplicate report", 16, raw.failingCreate, dup)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func row(workload string, n int, cg, rw []Result) Row {
	r := Row{Workload: workload, InFlight: n, CgLedger: median(cg), Raw: median(rw)}
	if r.Raw.PerSecond > 0 {
		r.Ratio = r.CgLedger.PerSecond / r.Raw.PerSecond
	}
	if r.Raw.P99Ms > 0 {
		r.P99Ratio = r.CgLedger.P99Ms / r.Raw.P99Ms
	}
	return r
}

// withLimit adds the protocol limit's medians and the ratios to them.
func withLimit(r Row, lim []Result) Row {
	l := median(lim)
	r.Limit = &l
	if l.PerSecond > 0 {
		r.LimitRatio = r.CgLedger.PerSecond / l.PerSecond
	}
	if l.P99Ms > 0 {
		r.LimitP99Ratio = r.CgLedger.P99Ms / l.P99Ms
	}
	if l.CPUMicros > 0 {
		r.LimitCPURatio = r.CgLedger.CPUMicros / l.CPUMicros
	}
	return r
}

// median takes each figure's median over the rounds.
func median(rs []Result) Result {
	pick := func(f func(Result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	out := Result{
		PerSecond:  pick(func(r Result) float64 { return r.PerSecond }),
		P50Ms:      pick(func(r Result) float64 { return r.P50Ms }),
		P99Ms:      pick(func(r Result) float64 { return r.P99Ms }),
		CPUMicros:  pick(func(r Result) float64 { return r.CPUMicros }),
		LedgerMsgs: pick(func(r Result) float64 { return r.LedgerMsgs }),
		CommitsPer: pick(func(r Result) float64 { return r.CommitsPer }),
	}
	for _, r := range rs {
		out.Calls += r.Calls
		out.Errors += r.Errors
		out.ResultsInFlight = max(out.ResultsInFlight, r.ResultsInFlight)
	}
	return out
}

// setup gives the bench's agents a roster entry and routes wakeups to the
// calls waiting for them.
func (e *env) setup(ctx context.Context) error {
	if _, err := e.cl.SetRoster(ctx, protocol.RosterEntry{ProjectID: "bench", AgentID: "agent", WorkerTarget: "bench-worker"}); err != nil {
		return fmt.Errorf("roster: %w", err)
	}
	_, err := e.worker.Subscribe(protocol.WakeupSubject(protocol.DefaultVersion, "bench", "*", "bench-worker"), func(m *nats.Msg) {
		e.waiters.wake(m.Header.Get(protocol.HeaderToolCallID))
	})
	if err != nil {
		return err
	}
	return e.worker.Flush()
}

// call runs one echo call end to end, as a worker does.
func (e *env) call(ctx context.Context) error { return e.callTool(ctx, "echo") }

// callTool runs one call of tool end to end: dispatch, wait for the wakeup,
// consume the result from the Inbox.
func (e *env) callTool(ctx context.Context, tool string) error {
	turn, id := e.nextCall()
	// The wakeup can come before Dispatch returns: wait for it from before.
	woken := e.waiters.expect(id)
	defer e.waiters.forget(id)
	if _, err := e.dispatch(ctx, tool, turn, id); err != nil {
		return err
	}
	select {
	case <-woken:
	case <-ctx.Done():
		return ctx.Err()
	}
	_, err := e.cl.Consume(ctx, protocol.ConsumeRequest{ProjectID: "bench", AgentID: "agent", AgentTurnID: turn, ToolCallID: id})
	return err
}

// duplicateReport returns a function that repeats the report of one
// finished call, as a retrying tool service would.
func (e *env) duplicateReport(ctx context.Context) (func(context.Context) error, error) {
	if err := e.call(ctx); err != nil {
		return nil, fmt.Errorf("a call to repeat: %w", err)
	}
	n := e.seq.Load()
	turn, id := "turn-"+strconv.FormatInt(n/100, 10), "call-"+strconv.FormatInt(n, 10)
	admin := client.New(e.admin, client.WithActor("echo"))
	rec, err := admin.GetCall(ctx, "bench", turn, id)
	if err != nil || rec.Claim == nil {
		return nil, fmt.Errorf("read the call to repeat: %v", err)
	}
	req := protocol.ReportRequest{ProjectID: "bench", ChannelID: rec.ChannelID, SourceID: rec.Claim.SourceID, SourceFunction: "echo",
		Identity: protocol.Identity{AgentID: rec.AgentID, AgentTurnID: turn, TurnEpoch: rec.TurnEpoch, ToolCallID: id},
		Payload:  protocol.ReportPayload{Status: rec.Claim.Status, AfterExecution: rec.Claim.AfterExecution, ToolResultCardID: rec.Claim.ToolResultCardID}}
	return func(ctx context.Context) error {
		out, err := admin.Report(ctx, req)
		if err == nil && !out.Duplicate {
			return errors.New("a repeated report was not a duplicate")
		}
		return err
	}, nil
}

// measure runs op with n callers for d and collects the figures. counters
// marks the cgledger side, whose runs are profiled one by one when asked
// (Config.CPUProfileEach).
func (e *env) measure(ctx context.Context, workload string, d time.Duration, n int, op func(context.Context) error, counters bool) (Result, error) {
	var api0, commits0 float64
	if counters {
		api0, commits0 = e.counters(ctx)
		stop, err := e.profileRun(workload, n)
		if err != nil {
			return Result{}, err
		}
		defer stop()
	}
	cpu0 := cpuTime()
	start := time.Now()
	end := start.Add(d)
	var mu sync.Mutex
	var lat []time.Duration
	var errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(end) {
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				t0 := time.Now()
				err := op(cctx)
				cancel()
				if errors.Is(err, errPoolEmpty) {
					break
				}
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0
	if len(lat) == 0 {
		return Result{}, fmt.Errorf("no call completed (%d errors, first: %v)", errs.Load(), firstErr.Load())
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	r := Result{Calls: len(lat), PerSecond: float64(len(lat)) / elapsed.Seconds(), P50Ms: q(0.50), P99Ms: q(0.99),
		CPUMicros: float64(cpu.Microseconds()) / float64(len(lat)), Errors: int(errs.Load())}
	if counters {
		api1, commits1 := e.counters(ctx)
		r.LedgerMsgs, r.CommitsPer = (api1-api0)/float64(len(lat)), (commits1-commits0)/float64(len(lat))
	}
	return r, nil
}

// counters reads how many messages the ledger account's connections sent
// the server (JetStream publishes, KV operations, reads, API replies, acks:
// the server's own account statistics) and the projector's batch commits.
func (e *env) counters(ctx context.Context) (msgs, commits float64) {
	if e.srv != nil {
		if st, err := e.srv.AccountStatz(&server.AccountStatzOptions{Accounts: []string{e.ledgerAccount}}); err == nil && len(st.Accounts) == 1 {
			msgs = float64(st.Accounts[0].Received.Msgs)
		}
	}
	resp, err := http.Get(e.httpURL + "/metrics")
	if err != nil {
		return msgs, 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "cgledger_projector_batch_commit_duration_seconds_count "); ok {
			commits, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return msgs, commits
}

// profileRun starts a CPU profile of one cgledger run into its own file
// of Config.CPUProfileEach, and returns what stops it.
func (e *env) profileRun(workload string, n int) (func(), error) {
	if e.profileDir == "" {
		return func() {}, nil
	}
	e.profiles++
	f, err := os.Create(filepath.Join(e.profileDir, fmt.Sprintf("%s-%d-%03d.prof", workload, n, e.profiles)))
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile-each: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile-each: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rawWorkload holds the baselines: the same work with nothing but JetStream,
// written as a JetStream user would (asynchronous publishes, acknowledged
// as their acks arrive), so the ratios are not flattered by a baseline that
// waits on one message at a time.
type rawWorkload struct {
	js      jetstream.JetStream
	nc      *nats.Conn
	cc      []jetstream.ConsumeContext
	kv      jetstream.KeyValue // the failing create's bucket
	calls   jetstream.KeyValue // the protocol limit's call keys
	waiters waiters
	seq     atomic.Int64
	// pending holds the consumers' publishes awaiting their acks, in the
	// order they were sent; done stops the goroutine that settles them.
	pending chan rawPending
	done    chan struct{}
	// inFlight and maxInFlight count the results published and not yet
	// acknowledged: above 1, results are pipelined.
	inFlight, maxInFlight atomic.Int64
}

// rawPending is a consumer's answer to one command: the acks it waits for
// before it wakes the caller (wake, when set) and acknowledges the command.
type rawPending struct {
	acks []jetstream.PubAckFuture
	wake string
	msg  jetstream.Msg
}

// rawMaxPending bounds the asynchronous publishes: two per call at the
// largest in-flight level --inflight allows, on each side.
const rawMaxPending = 4 * 4096

// The raw baselines' subjects. Wakeups are published with core NATS on a
// subject the stream stores: the protocol keeps every wakeup as a ledger
// entry, and a core publish stores it without waiting for its ack.
const (
	rawStream      = "BENCH_RAW"
	rawSubjects    = "rawbench.>"
	rawWakePrefix  = "rawbench.wake."
	rawLimitPrefix = "rawbench.limit."
)

func newRawWorkload(ctx context.Context, js0 jetstream.JetStream) (*rawWorkload, error) {
	js, err := jetstream.New(js0.Conn(), jetstream.WithPublishAsyncMaxPending(rawMaxPending))
	if err != nil {
		return nil, err
	}
	r := &rawWorkload{js: js, nc: js.Conn(), pending: make(chan rawPending, rawMaxPending), done: make(chan struct{})}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: rawStream, Subjects: []string{rawSubjects}, Storage: jetstream.FileStorage}); err != nil {
		return nil, fmt.Errorf("raw stream: %w", err)
	}
	go r.settle()
	// The round trip's service: the result, published asynchronously.
	if err := r.consume(ctx, "worker", "rawbench.cmd.>", func(m jetstream.Msg) (rawPending, error) {
		id := strings.TrimPrefix(m.Subject(), "rawbench.cmd.")
		f, err := js.PublishAsync("rawbench.res."+id, m.Data())
		return rawPending{acks: []jetstream.PubAckFuture{f}, msg: m}, err
	}); err != nil {
		return nil, err
	}
	// The protocol limit's tool service: the result card and the report
	// together, the report only if it is the call's first, then the wakeup.
	if err := r.consume(ctx, "limit-worker", rawLimitPrefix+"cmd.>", func(m jetstream.Msg) (rawPending, error) {
		id := strings.TrimPrefix(m.Subject(), rawLimitPrefix+"cmd.")
		card, err := js.PublishAsync(rawLimitPrefix+"card."+id, rawResultCard)
		if err != nil {
			return rawPending{}, err
		}
		rep, err := js.PublishMsgAsync(&nats.Msg{Subject: rawLimitPrefix + "rep." + id, Data: rawReport},
			jetstream.WithExpectLastSequencePerSubject(0))
		return rawPending{acks: []jetstream.PubAckFuture{card, rep}, wake: rawWakePrefix + "limit." + id, msg: m}, err
	}); err != nil {
		return nil, err
	}
	for _, prefix := range []string{"rawbench.res.", rawWakePrefix + "limit."} {
		prefix := prefix
		if _, err := r.nc.Subscribe(prefix+"*", func(m *nats.Msg) { r.wake(strings.TrimPrefix(m.Subject, prefix)) }); err != nil {
			return nil, err
		}
	}
	if r.kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "BENCH_RAW_KV"}); err != nil {
		return nil, fmt.Errorf("raw bucket: %w", err)
	}
	if _, err := r.kv.Create(ctx, "taken", []byte("x")); err != nil {
		return nil, err
	}
	if r.calls, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "BENCH_RAW_CALLS", Storage: jetstream.FileStorage}); err != nil {
		return nil, fmt.Errorf("raw call bucket: %w", err)
	}
	return r, r.nc.Flush()
}

// The payloads of the baselines' messages, about the size of the ledger's.
var (
	rawCommand    = []byte(`{"tool_call_card_id":"cc","tool_name":"echo","after_execution":"suspend"}`)
	rawCard       = []byte(`{"card_id":"cc","type":"tool.call","author_id":"agent","content":{"tool_name":"echo","arguments":{"text":"bench"}}}`)
	rawResultCard = []byte(`{"card_id":"rc","type":"tool.result","author_id":"svc.echo","content":{"status":"success","result":{"text":"bench"}}}`)
	rawReport     = []byte(`{"status":"success","after_execution":"suspend","tool_result_card_id":"rc"}`)
)

// consume runs a durable pull consumer of filter whose handler publishes
// asynchronously; the command is acknowledged once those publishes are.
func (r *rawWorkload) consume(ctx context.Context, name, filter string, handle func(jetstream.Msg) (rawPending, error)) error {
	cons, err := r.js.CreateOrUpdateConsumer(ctx, rawStream, jetstream.ConsumerConfig{Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return fmt.Errorf("raw consumer %s: %w", name, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		p, err := handle(m)
		if err != nil {
			_ = m.Term()
			return
		}
		if n := r.inFlight.Add(1); n > r.maxInFlight.Load() {
			r.maxInFlight.Store(n) // a high-water mark: a lost race only lowers it by one
		}
		r.pending <- p
	}, jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("raw consumer %s: %w", name, err)
	}
	r.cc = append(r.cc, cc)
	return nil
}

// settle waits for each answer's acks in order (they arrive about in
// order), then wakes the caller and acknowledges the command.
func (r *rawWorkload) settle() {
	for {
		select {
		case <-r.done:
			return
		case p := <-r.pending:
			ok := true
			for _, f := range p.acks {
				select {
				case <-f.Ok():
				case <-f.Err():
					ok = false
				case <-r.done:
					return
				}
			}
			r.inFlight.Add(-1)
			if !ok {
				_ = p.msg.Nak()
				continue
			}
			if p.wake != "" {
				_ = r.nc.Publish(p.wake, nil)
			}
			_ = p.msg.Ack()
		}
	}
}

func (r *rawWorkload) close() {
	for _, cc := range r.cc {
		cc.Stop()
	}
	close(r.done)
}

// resultsInFlight returns the most results published and not yet
// acknowledged at once since the last call, and starts counting again.
func (r *rawWorkload) resultsInFlight() int { return int(r.maxInFlight.Swap(0)) }

// expect registers a waiter for id's answer before anything is sent, since
// the answer can come before the send returns.
func (r *rawWorkload) expect(id string) chan struct{} { return r.waiters.expect(id) }

func (r *rawWorkload) forget(id string) { r.waiters.forget(id) }

func (r *rawWorkload) wake(id string) { r.waiters.wake(id) }

// report: the floor of a report, an append that only the first may make
// (expected-last-subject-sequence 0 on a subject of its own) and a core
// NATS wakeup.
func (r *rawWorkload) report(ctx context.Context) error {
	id := strconv.FormatInt(r.seq.Add(1), 10)
	if _, err := r.js.Publish(ctx, "rawbench.rep."+id, rawReport, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		return err
	}
	return r.nc.Publish(rawWakePrefix+"rep."+id, nil)
}

// call: the raw round trip. Publish a command, a pull consumer publishes the
// result, the caller receives it; the command's ack is awaited alongside
// the result, not before it.
func (r *rawWorkload) call(ctx context.Context) error {
	id := strconv.FormatInt(r.seq.Add(1), 10)
	done := r.expect(id)
	defer r.forget(id)
	f, err := r.js.PublishAsync("rawbench.cmd."+id, rawCommand)
	if err != nil {
		return err
	}
	if err := ack(ctx, f); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// protocolLimit: a conformant call on raw JetStream alone, the protocol's
// own limit. The caller creates the call's key (the first dispatch wins),
// publishes the tool.call card and the command together, and waits for the
// wakeup; the tool service pulls the command, publishes the result card and
// the report together (the report only as the call's first), and then the
// wakeup (core NATS, stored by the stream): the call key and five stored
// messages, no ledger.
func (r *rawWorkload) protocolLimit(ctx context.Context) error {
	id := strconv.FormatInt(r.seq.Add(1), 10)
	done := r.expect(id)
	defer r.forget(id)
	if _, err := r.calls.Create(ctx, "call-"+id, []byte(`{"state":"dispatched"}`)); err != nil {
		return fmt.Errorf("call key: %w", err)
	}
	card, err := r.js.PublishAsync(rawLimitPrefix+"call."+id, rawCard)
	if err != nil {
		return err
	}
	cmd, err := r.js.PublishAsync(rawLimitPrefix+"cmd."+id, rawCommand)
	if err != nil {
		return err
	}
	if err := ack(ctx, card); err != nil {
		return err
	}
	if err := ack(ctx, cmd); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ack waits for an asynchronous publish's ack.
func ack(ctx context.Context, f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// failingCreate: the raw cost of finding out that something already exists.
func (r *rawWorkload) failingCreate(ctx context.Context) error {
	_, err := r.kv.Create(ctx, "taken", []byte("x"))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil
	}
	if err == nil {
		return errors.New("create of an existing key succeeded")
	}
	return err
}
