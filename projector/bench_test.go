package projector_test

// Benchmarks of the projector's two costs: applying the ledger (a rebuild
// from sequence 1, against a raw JetStream read of the same stream) and
// answering audit queries (against views of 10k and 1M calls, to show
// whether latency depends on the ledger's size).
//
// BenchmarkRebuild writes a real ledger through ledgertest (rebuildCalls
// calls, each a dispatch, a result card and a report: card + command +
// result card + report + wakeup entries), then measures
//
//   - projector:            a fresh store caught up from sequence 1;
//   - raw_ordered_consumer: a JetStream ordered consumer reading the same
//     entries (the floor any consumer of the stream pays).
//
// Both report entries/s; the parent prints projector/raw (goal >= 0.5x).
// (The testing package never prints metrics of a benchmark that has
// sub-benchmarks, so they are reported on the sub-benchmarks.)
//
// BenchmarkQuery builds the views without NATS from entries synthesized
// exactly as the ledger writes them (same subjects, headers and JSON), and
// measures each query's latency at calls=10k and calls=1M. The 1M store
// (~5.5M entries) takes a while to build, so it runs only with
// CGLEDGER_BENCH_LARGE=1, keeping `go test -bench . -benchtime 1x` fast. Each
// size is built once per test process, in a package-level cache shared by
// every run (-count, -cpu) of the sub-benchmarks, and removed at the end.
//
// Each query sub-benchmark reports p50-ns and p99-ns (one operation's
// latency) beside the mean ns/op. Nothing here asserts on timing.

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

const (
	// rebuildCalls is the size of BenchmarkRebuild's ledger: five entries a
	// call, so ~10k entries.
	rebuildCalls = 2000
	// rebuildWorkers write the ledger concurrently (outside the timer).
	rebuildWorkers = 16
	// rawPullMax matches the projector's default pull size (2 x BatchSize).
	rawPullMax = 2 * 512
)

// BenchmarkRebuild compares a projector rebuild with a raw read of the stream.
func BenchmarkRebuild(b *testing.B) {
	e := ledgertest.New(b)
	ctx := b.Context()
	start := time.Now()
	e.WriteCalls(b, ctx, rebuildCalls, rebuildWorkers)
	s, err := e.JS.Stream(ctx, e.L.StreamName())
	require.NoError(b, err)
	st := s.CachedInfo().State
	require.Equal(b, uint64(1), st.FirstSeq)
	require.Equal(b, st.LastSeq, st.Msgs, "the stream has no deleted entries, so a count ends the raw read")
	entries := st.LastSeq
	fmt.Printf("BenchmarkRebuild: ledger of %d calls, %d entries (%d bytes) written in %v\n",
		rebuildCalls, entries, st.Bytes, time.Since(start).Round(time.Millisecond))

	var projRate, rawRate float64
	b.Run("projector", func(b *testing.B) {
		root := b.TempDir()
		n := 0
		for b.Loop() {
			b.StopTimer()
			n++
			dir := filepath.Join(root, strconv.Itoa(n))
			store, err := projector.OpenStore(dir, projector.StoreOptions{})
			require.NoError(b, err)
			p, err := projector.New(store, e.JS, projector.Config{})
			require.NoError(b, err)
			b.StartTimer()

			require.NoError(b, p.CatchUp(ctx))

			b.StopTimer()
			require.Equal(b, entries, p.Applied())
			require.NoError(b, store.Close())
			require.NoError(b, os.RemoveAll(dir))
			b.StartTimer()
		}
		projRate = float64(entries) * float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(projRate, "entries/s")
		b.ReportMetric(float64(entries), "entries/op")
	})
	b.Run("raw_ordered_consumer", func(b *testing.B) {
		for b.Loop() {
			n, size := ledgertest.ReadAll(b, ctx, s, entries, rawPullMax)
			if n != entries || size == 0 {
				b.Fatalf("raw read %d entries (%d bytes), want %d", n, size, entries)
			}
		}
		rawRate = float64(entries) * float64(b.N) / b.Elapsed().Seconds()
		b.ReportMetric(rawRate, "entries/s")
		b.ReportMetric(float64(entries), "entries/op")
	})
	if projRate > 0 && rawRate > 0 {
		fmt.Printf("BenchmarkRebuild: projector %.0f entries/s, raw ordered consumer %.0f entries/s: projector/raw = %.2fx (goal >= 0.5x)\n",
			projRate, rawRate, projRate/rawRate)
	}
}

// Synthesized ledger shape for BenchmarkQuery. Agents run turns of
// synthCallsPerTurn sequential calls, synthAgents turns at a time (one per
// agent), so a turn's entries interleave with the other agents' as in a busy
// ledger. Each call writes card + command + result card + report + wakeup.
// Agents with an even index consume their results (a consumed entry after
// the wakeup) except the last synthPendingPerAgent; odd agents never consume.
const (
	synthProject         = "proj"
	synthAgents          = 16
	synthChannels        = 4
	synthTools           = 8
	synthCallsPerTurn    = 5
	synthCallsPerWave    = synthAgents * synthCallsPerTurn
	synthPendingPerAgent = 100
	// synthApplyBatch is ApplyEntries' batch size while building.
	synthApplyBatch = 8192
	// synthChunkWaves bounds the entries held in memory while building.
	synthChunkWaves = 500
	// queryPicks is how many random targets each query benchmark cycles through.
	queryPicks = 4096
)

var synthT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func synthAgent(a int) string   { return fmt.Sprintf("agent-%02d", a) }
func synthTurn(t int) string    { return fmt.Sprintf("turn-%08d", t) }
func synthCall(i int) string    { return fmt.Sprintf("call-%09d", i) }
func synthTool(i int) string    { return "tool-" + strconv.Itoa(i%synthTools) }
func synthChannel(a int) string { return "ch-" + strconv.Itoa(a%synthChannels) }

// synthCallIDs returns call i's turn, agent, channel and tool.
func synthCallIDs(i int) (turn, agent, channel, tool string, agentIdx int) {
	t := i / synthCallsPerTurn
	a := t % synthAgents
	return synthTurn(t), synthAgent(a), synthChannel(a), synthTool(i), a
}

func synthStatus(i int) string {
	if i%10 == 9 {
		return protocol.StatusFailed
	}
	return protocol.StatusSuccess
}

// synthConsumed says whether call i of a ledger of calls calls is consumed.
func synthConsumed(i, calls int) bool {
	_, _, _, _, a := synthCallIDs(i)
	return a%2 == 0 && i < calls-synthAgents*synthPendingPerAgent
}

// synth appends entries as the ledger writes them.
type synth struct {
	seq uint64
	out []protocol.Entry
}

func (s *synth) add(subject string, kind protocol.EntryKind, h nats.Header, data any) uint64 {
	b, err := json.Marshal(data)
	if err != nil {
		panic(err)
	}
	s.seq++
	t := synthT0.Add(time.Duration(s.seq) * 50 * time.Microsecond)
	h.Set(protocol.HeaderEntryKind, string(kind))
	h.Set(protocol.HeaderTime, protocol.FormatTime(t))
	h.Set("Nats-Expected-Stream", stream.DefaultName)
	s.out = append(s.out, protocol.Entry{Seq: s.seq, Subject: subject, Headers: h, Data: b, Time: t.Add(20 * time.Microsecond)})
	return s.seq
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func (s *synth) roster(a int) {
	h := nats.Header{}
	h.Set(protocol.HeaderProjectID, synthProject)
	h.Set(protocol.HeaderAgentID, synthAgent(a))
	s.add(protocol.RosterSubject(protocol.DefaultVersion, synthProject, synthAgent(a)), protocol.KindRoster, h,
		protocol.RosterEntry{ProjectID: synthProject, AgentID: synthAgent(a), WorkerTarget: "worker-" + synthAgent(a)})
}

func synthMeta(turn, id string) protocol.CardMetadata {
	return protocol.CardMetadata{TraceID: "trace-" + turn, ParentStepID: "parent-" + id, StepID: "step-" + id}
}

func (s *synth) card(c protocol.Card) uint64 {
	h := nats.Header{}
	h.Set(protocol.HeaderProjectID, c.ProjectID)
	h.Set(protocol.HeaderAgentTurnID, c.AgentTurnID)
	h.Set(protocol.HeaderToolCallID, c.ToolCallID)
	h.Set("Nats-Expected-Last-Subject-Sequence", "0")
	return s.add(protocol.CardSubject(protocol.DefaultVersion, c.ProjectID, c.CardID), protocol.KindCard, h, c)
}

// dispatch writes call i's tool.call card and command; it returns the
// command's sequence.
func (s *synth) dispatch(i int) uint64 {
	turn, agent, channel, tool, _ := synthCallIDs(i)
	id := synthCall(i)
	cardID := "cc-" + turn + "-" + id
	s.card(protocol.Card{
		CardID: cardID, ProjectID: synthProject, Type: protocol.CardToolCall, AuthorID: agent,
		AgentTurnID: turn, ToolCallID: id,
		Content:  mustJSON(protocol.ToolCallContent{ToolName: tool, Arguments: json.RawMessage(`{"q":"` + id + `"}`)}),
		Metadata: synthMeta(turn, id),
	})
	h := protocol.Identity{AgentID: agent, AgentTurnID: turn, TurnEpoch: 1, ToolCallID: id}.Header()
	h.Set(protocol.HeaderMsgID, "cmd."+synthProject+"."+turn+"."+id)
	return s.add(protocol.ToolCommandSubject(protocol.DefaultVersion, synthProject, channel, tool), protocol.KindCommand, h,
		protocol.ToolCommandPayload{ToolCallCardID: cardID, ToolName: tool, AfterExecution: protocol.AfterSuspend})
}

// result writes call i's tool.result card, report, wakeup and, if the agent
// consumes it, the consumed entry.
func (s *synth) result(i, calls int, commandSeq uint64) {
	turn, agent, channel, tool, _ := synthCallIDs(i)
	id := synthCall(i)
	status := synthStatus(i)
	content := protocol.ToolResultContent{Status: status, Result: json.RawMessage(`{"n":1}`)}
	if status == protocol.StatusFailed {
		content.Error = &protocol.ToolError{Code: "internal_error", Message: "boom"}
	}
	rcID := "rc-" + turn + "-" + id + "-" + status
	rcSeq := s.card(protocol.Card{
		CardID: rcID, ProjectID: synthProject, Type: protocol.CardToolResult, AuthorID: "tool." + tool, FunctionName: tool,
		AgentTurnID: turn, ToolCallID: id, Content: mustJSON(content), Metadata: synthMeta(turn, id),
	})
	id0 := protocol.Identity{AgentID: agent, AgentTurnID: turn, TurnEpoch: 1, ToolCallID: id}

	h := id0.Header()
	h.Set(protocol.HeaderProjectID, synthProject)
	h.Set(protocol.HeaderChannelID, channel)
	h.Set(protocol.HeaderSourceID, "tool."+tool)
	h.Set(protocol.HeaderSourceFunction, tool)
	h.Set(protocol.HeaderMsgID, "report."+synthProject+"."+turn+"."+id)
	h.Set("Nats-Expected-Last-Subject-Sequence", "0")
	reportSeq := s.add(protocol.ReportSubject(protocol.DefaultVersion, synthProject, channel, turn, id), protocol.KindReport, h, protocol.ReportEntry{
		CallID: protocol.CallID{ProjectID: synthProject, ChannelID: channel, AgentID: agent, AgentTurnID: turn, TurnEpoch: 1, ToolCallID: id},
		Status: status, AfterExecution: protocol.AfterSuspend, EffectiveAfterExecution: protocol.AfterSuspend,
		ToolResultCardID: rcID, ToolResultCardSeq: rcSeq, ToolCallCardID: "cc-" + turn + "-" + id, ToolName: tool,
		SourceID: "tool." + tool, SourceFunction: tool, CommandSeq: commandSeq,
	})

	worker := "worker-" + agent
	h = id0.Header()
	h.Set(protocol.HeaderMsgID, "wakeup."+synthProject+"."+turn+"."+id)
	s.add(protocol.WakeupSubject(protocol.DefaultVersion, synthProject, channel, worker), protocol.KindWakeup, h, protocol.WakeupEntry{
		ProjectID: synthProject, ChannelID: channel, AgentID: agent, WorkerTarget: worker, AgentTurnID: turn, TurnEpoch: 1,
		ToolCallID: id, Status: status, ToolResultCardID: rcID, EffectiveAfterExecution: protocol.AfterSuspend, ReportSeq: reportSeq,
	})

	if !synthConsumed(i, calls) {
		return
	}
	h = id0.Header()
	h.Set(protocol.HeaderProjectID, synthProject)
	h.Set(protocol.HeaderChannelID, channel)
	h.Set("Nats-Expected-Last-Subject-Sequence", "0")
	s.add(protocol.ConsumedSubject(protocol.DefaultVersion, synthProject, channel, turn, id), protocol.KindConsumed, h, protocol.ConsumedEntry{
		ProjectID: synthProject, ChannelID: channel, AgentID: agent, AgentTurnID: turn, ToolCallID: id, ReportSeq: reportSeq,
	})
}

// wave writes the synthAgents turns of wave w: call j of every turn is
// dispatched, then reported, before call j+1.
func (s *synth) wave(w, calls int) {
	var cmd [synthAgents]uint64
	for j := range synthCallsPerTurn {
		for a := range synthAgents {
			cmd[a] = s.dispatch((w*synthAgents+a)*synthCallsPerTurn + j)
		}
		for a := range synthAgents {
			s.result((w*synthAgents+a)*synthCallsPerTurn+j, calls, cmd[a])
		}
	}
}

// builtViews is a store built for one size, shared by every run of
// BenchmarkQuery in the process.
type builtViews struct {
	dir     string
	store   *projector.Store
	calls   int
	entries uint64
}

var viewCache struct {
	sync.Mutex
	views map[int]*builtViews
}

// views returns the store for calls calls, building it on first use.
func views(b *testing.B, calls int) *builtViews {
	b.Helper()
	viewCache.Lock()
	defer viewCache.Unlock()
	if v := viewCache.views[calls]; v != nil {
		return v
	}
	if calls%synthCallsPerWave != 0 {
		b.Fatalf("calls must be a multiple of %d", synthCallsPerWave)
	}
	dir, err := os.MkdirTemp("", "cgledger-projector-bench-")
	require.NoError(b, err)
	cleanup := func() { _ = os.RemoveAll(dir) }
	store, err := projector.OpenStore(dir, projector.StoreOptions{})
	if err != nil {
		cleanup()
		b.Fatal(err)
	}
	start := time.Now()
	s := &synth{}
	for a := range synthAgents {
		s.roster(a)
	}
	waves := calls / synthCallsPerWave
	for w := 0; w < waves; w += synthChunkWaves {
		for x := w; x < min(w+synthChunkWaves, waves); x++ {
			s.wave(x, calls)
		}
		if err := projector.ApplyEntries(store, s.out, synthApplyBatch); err != nil {
			_ = store.Close()
			cleanup()
			b.Fatal(err)
		}
		clear(s.out)
		s.out = s.out[:0]
	}
	applied := time.Since(start)
	// Close and reopen: every memtable is flushed, so the sstables hold all
	// the views, and queries start from a store as a restart would leave it.
	if err := store.Close(); err != nil {
		cleanup()
		b.Fatal(err)
	}
	built := time.Since(start)
	size, sst := dirSize(dir)
	if store, err = projector.OpenStore(dir, projector.StoreOptions{}); err != nil {
		cleanup()
		b.Fatal(err)
	}
	settle, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	if err := store.SettleCompactions(settle); err != nil {
		fmt.Printf("BenchmarkQuery: compactions still running after 10m (%v); querying anyway\n", err)
	}
	cancel()
	fmt.Printf("BenchmarkQuery: built views of %d calls (%d entries) without NATS in %v (applied in %v, %.0f entries/s); "+
		"store %.1f MiB on disk, %.1f MiB of it sstables (%.0f B/entry)\n",
		calls, s.seq, built.Round(time.Millisecond), applied.Round(time.Millisecond), float64(s.seq)/applied.Seconds(),
		float64(size)/(1<<20), float64(sst)/(1<<20), float64(sst)/float64(s.seq))
	v := &builtViews{dir: dir, store: store, calls: calls, entries: s.seq}
	if viewCache.views == nil {
		viewCache.views = map[int]*builtViews{}
	}
	viewCache.views[calls] = v
	return v
}

// dirSize returns the bytes of the files in dir, and of its sstables (the
// rest is mostly write-ahead logs Pebble keeps for reuse).
func dirSize(dir string) (total, sst int64) {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
				if strings.HasSuffix(path, ".sst") {
					sst += fi.Size()
				}
			}
		}
		return nil
	})
	return total, sst
}

// querySizes are BenchmarkQuery's ledger sizes, in calls.
var querySizes = []struct {
	name  string
	calls int
	// large sizes run only with CGLEDGER_BENCH_LARGE=1: building 1M calls
	// (~5.5M entries) takes minutes and gigabytes, too much for CI's
	// `go test -bench . -benchtime 1x`.
	large bool
}{
	{"10k", 10_000, false},
	{"1M", 1_000_000, true},
}

// BenchmarkQuery measures query latency at each ledger size.
func BenchmarkQuery(b *testing.B) {
	// The testing package runs a benchmark that has sub-benchmarks once per
	// process (-count and -cpu repeat only the leaves), so the views built
	// below serve every run and can go when this run ends.
	b.Cleanup(func() {
		viewCache.Lock()
		defer viewCache.Unlock()
		for k, v := range viewCache.views {
			_ = v.store.Close()
			_ = os.RemoveAll(v.dir)
			delete(viewCache.views, k)
		}
	})
	for _, size := range querySizes {
		b.Run("calls="+size.name, func(b *testing.B) {
			if size.large && os.Getenv("CGLEDGER_BENCH_LARGE") != "1" {
				b.Skip("set CGLEDGER_BENCH_LARGE=1 to build and query the 1M-call views")
			}
			benchQueries(b, views(b, size.calls))
		})
	}
}

func benchQueries(b *testing.B, v *builtViews) {
	q := projector.NewQueries(v.store)
	rng := rand.New(rand.NewPCG(1, uint64(v.calls)))
	calls := make([]int, queryPicks)
	for k := range calls {
		calls[k] = rng.IntN(v.calls)
	}
	type pick struct{ turn, call string }
	picks := make([]pick, queryPicks)
	for k, i := range calls {
		turn, _, _, _, _ := synthCallIDs(i)
		picks[k] = pick{turn, synthCall(i)}
	}
	turns := v.calls / synthCallsPerTurn
	entriesPerTurn := func(t int) int {
		n := 0
		for j := range synthCallsPerTurn {
			n += 5
			if synthConsumed(t*synthCallsPerTurn+j, v.calls) {
				n++
			}
		}
		return n
	}

	b.Run("timeline", func(b *testing.B) {
		ts := make([]int, queryPicks)
		for k := range ts {
			ts[k] = rng.IntN(turns)
		}
		tl, err := q.Timeline(synthProject, synthTurn(ts[0]), projector.AsOf{})
		require.NoError(b, err)
		require.Len(b, tl.Items, entriesPerTurn(ts[0]))
		loopLatency(b, func(k int) error {
			_, err := q.Timeline(synthProject, synthTurn(ts[k%queryPicks]), projector.AsOf{})
			return err
		})
	})
	b.Run("call_story", func(b *testing.B) {
		cs, err := q.CallStory(synthProject, picks[0].call, "", projector.AsOf{})
		require.NoError(b, err)
		require.Len(b, cs.Calls, 1)
		require.GreaterOrEqual(b, len(cs.Items), 5)
		loopLatency(b, func(k int) error {
			_, err := q.CallStory(synthProject, picks[k%queryPicks].call, "", projector.AsOf{})
			return err
		})
	})
	b.Run("call_state", func(b *testing.B) {
		st, _, err := q.CallState(synthProject, picks[0].turn, picks[0].call, projector.AsOf{})
		require.NoError(b, err)
		require.Contains(b, []string{projector.StateReported, projector.StateConsumed}, st.State)
		loopLatency(b, func(k int) error {
			p := picks[k%queryPicks]
			_, _, err := q.CallState(synthProject, p.turn, p.call, projector.AsOf{})
			return err
		})
	})
	// An agent that never consumes: its oldest results are the pending page.
	b.Run("inbox_pending", func(b *testing.B) {
		benchInbox(b, q, 1)
	})
	// An agent that consumed all but its last synthPendingPerAgent results:
	// the pending page is at the end of its Inbox.
	b.Run("inbox_pending_mostly_consumed", func(b *testing.B) {
		benchInbox(b, q, 0)
	})
	b.Run("calls_tool_limit50", func(b *testing.B) {
		page, err := q.Calls(synthProject, projector.CallFilter{Tool: synthTool(0)}, projector.AsOf{}, "", 50)
		require.NoError(b, err)
		require.Len(b, page.Items, 50)
		require.NotEmpty(b, page.NextCursor)
		loopLatency(b, func(k int) error {
			_, err := q.Calls(synthProject, projector.CallFilter{Tool: synthTool(k)}, projector.AsOf{}, "", 50)
			return err
		})
	})
}

// benchInbox reads the first pending page (default limit) of the Inbox of
// agents with parity (0: agents that consume, 1: agents that never do).
func benchInbox(b *testing.B, q *projector.Queries, parity int) {
	page, err := q.Inbox(synthProject, synthAgent(parity), projector.InboxPending, projector.AsOf{}, "", 0)
	require.NoError(b, err)
	require.Len(b, page.Items, synthPendingPerAgent)
	for _, it := range page.Items {
		require.Equal(b, projector.InboxPending, it.State)
	}
	loopLatency(b, func(k int) error {
		agent := synthAgent((2*k + parity) % synthAgents)
		_, err := q.Inbox(synthProject, agent, projector.InboxPending, projector.AsOf{}, "", 0)
		return err
	})
}

// loopLatency runs op(0), op(1), ... under b.Loop and reports the p50 and
// p99 of one op beside the mean ns/op: the question is whether a query stays
// flat as the ledger grows, and a mean can hide a tail that grows (a seek
// that misses the block cache) or be pulled up by a few slow operations.
// Each op is timed on its own, so time.Now's cost (tens of ns) is the same
// at every size and cancels in the 10k/1M ratio.
func loopLatency(b *testing.B, op func(k int) error) {
	b.Helper()
	var lat []time.Duration
	for k := 0; b.Loop(); k++ {
		start := time.Now()
		err := op(k)
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 50)), "p50-ns")
	b.ReportMetric(float64(percentile(lat, 99)), "p99-ns")
}

// percentile returns the nearest-rank pth percentile of sorted (zero when
// empty): a measured duration, never an interpolation between two.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100 // ceil(n*p/100), a 1-based rank
	return sorted[max(i, 1)-1]
}
