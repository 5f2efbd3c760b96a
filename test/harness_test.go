package test

// Shared pieces of the deterministic replay harness: a ledger with an
// executor on a real embedded server, waits on ledger conditions, replays of
// export files with their views collected, and the golden file formats.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cgledger/cgledger/executor/jina"
	"github.com/cgledger/cgledger/stream"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/replay"
)

// update regenerates the golden files in testdata (see record_test.go).
var update = flag.Bool("update", false, "regenerate golden files")

const (
	testdataDir = "testdata"
	scProject   = "proj"
	scChannel   = "main"
	// scWaitFor bounds every wait on a ledger condition.
	scWaitFor = 30 * time.Second
	scPollGap = 5 * time.Millisecond
)

// replayRig is a ledger on its own embedded server, plus (when a scenario needs
// one) an executor running the built-in tools and the scenario's own.
type replayRig struct {
	*ledgertest.Env
	t  *testing.T
	ex *executor.Executor
}

func newReplayRig(t *testing.T) *replayRig {
	t.Helper()
	return &replayRig{Env: ledgertest.New(t), t: t}
}

func (r *replayRig) ctx() context.Context { return ledgertest.Ctx(r.t) }

// toolImpl is a scenario's own tool implementation and its built-in definition.
type toolImpl struct {
	name string
	tool executor.Tool
	def  *protocol.ToolDefinition
}

// toolDef is a built-in-style definition for a scenario's tool.
func toolDef(name, determinism string, retry protocol.RetryPolicy) *protocol.ToolDefinition {
	return &protocol.ToolDefinition{
		ToolName: name, Description: "scenario tool " + name, Parameters: json.RawMessage(`{"type":"object"}`),
		TargetSubject:  "cg.v1.{project_id}.{channel_id}.cmd.tool." + name,
		AfterExecution: protocol.AfterSuspend,
		Limits:         protocol.ToolLimits{TimeoutMSDefault: 10_000, TimeoutMSMax: 60_000, ConcurrencyMax: 4},
		Determinism:    determinism, Retry: retry,
	}
}

// newExecutor builds an executor with the built-ins and extra tools; it does
// not start it (scenarios may write entries before any executor runs).
func (r *replayRig) newExecutor(extra ...toolImpl) *executor.Executor {
	r.t.Helper()
	ex, err := executor.New(r.L, r.NC, executor.Config{})
	require.NoError(r.t, err)
	require.NoError(r.t, executor.RegisterBuiltins(ex))
	require.NoError(r.t, jina.Register(ex, jina.Config{}))
	for _, im := range extra {
		require.NoError(r.t, ex.Register(im.name, im.tool, im.def))
	}
	r.ex = ex
	return ex
}

// start starts the executor; it stops with the test.
func (r *replayRig) start(ex *executor.Executor) {
	r.t.Helper()
	require.NoError(r.t, ex.Start(r.ctx()))
	r.t.Cleanup(func() { ex.Stop(context.Background()) })
}

// startExecutor is newExecutor then start.
func (r *replayRig) startExecutor(extra ...toolImpl) {
	r.t.Helper()
	r.start(r.newExecutor(extra...))
}

func (r *replayRig) roster(agents ...string) {
	r.t.Helper()
	for _, a := range agents {
		_, err := r.L.SetRoster(r.ctx(), protocol.RosterEntry{ProjectID: scProject, AgentID: a, WorkerTarget: "worker-" + a})
		require.NoError(r.t, err)
	}
}

// scCall names a call of the scenarios (fixed ids: cards are cc-<turn>-<id>,
// rc-<turn>-<id>-<status>).
func scCall(agent, turn, id string, epoch uint64, tool string) ledgertest.Call {
	return ledgertest.Call{Project: scProject, Channel: scChannel, Agent: agent, Turn: turn, ID: id, Epoch: epoch, Tool: tool}
}

// dispatchReq is the call's dispatch with the given arguments.
func dispatchReq(c ledgertest.Call, args string) protocol.DispatchRequest {
	req := c.Dispatch()
	req.Card.Content = json.RawMessage(fmt.Sprintf(`{"tool_name":%q,"arguments":%s}`, c.Tool, args))
	return req
}

func (r *replayRig) dispatch(req protocol.DispatchRequest) protocol.DispatchResult {
	r.t.Helper()
	res, err := r.L.Dispatch(r.ctx(), req)
	require.NoError(r.t, err, "dispatch %s", req.Identity.ToolCallID)
	return res
}

// resolved waits until the call's report and wakeup are written (the call
// record is woken) and returns the result card's content.
func (r *replayRig) resolved(c ledgertest.Call) protocol.ToolResultContent {
	r.t.Helper()
	var rec *protocol.CallRecord
	require.Eventually(r.t, func() bool {
		var err error
		rec, err = r.L.GetCall(context.Background(), c.Project, c.Turn, c.ID)
		return err == nil && rec.State == protocol.StateWoken
	}, scWaitFor, scPollGap, "call %s/%s resolves", c.Turn, c.ID)
	card, err := r.L.GetCard(r.ctx(), c.Project, rec.Claim.ToolResultCardID)
	require.NoError(r.t, err)
	tr, err := card.Card.ToolResult()
	require.NoError(r.t, err)
	return tr
}

// run dispatches the call and waits for its result.
func (r *replayRig) run(c ledgertest.Call, args string, mod func(*protocol.DispatchRequest)) protocol.ToolResultContent {
	r.t.Helper()
	req := dispatchReq(c, args)
	if mod != nil {
		mod(&req)
	}
	r.dispatch(req)
	return r.resolved(c)
}

func (r *replayRig) consume(c ledgertest.Call) protocol.ConsumeResult {
	r.t.Helper()
	res, err := r.L.Consume(r.ctx(), protocol.ConsumeRequest{ProjectID: c.Project, AgentID: c.Agent, AgentTurnID: c.Turn, ToolCallID: c.ID})
	require.NoError(r.t, err, "consume %s", c.ID)
	return res
}

// entryKind is an entry's CG-Entry-Kind, or "raw" for entries others
// published on cg.> without one (raw commands).
func entryKind(h map[string][]string) string {
	if k := nats.Header(h).Get(protocol.HeaderEntryKind); k != "" {
		return k
	}
	return "raw"
}

// countKind counts the ledger's entries of a kind.
func (r *replayRig) countKind(kind string) int {
	r.t.Helper()
	n := 0
	_, err := r.L.ReadEntries(r.ctx(), 1, func(e protocol.Entry) error {
		if entryKind(e.Headers) == kind {
			n++
		}
		return nil
	})
	require.NoError(r.t, err)
	return n
}

// waitKind waits until the ledger holds n entries of a kind.
func (r *replayRig) waitKind(kind string, n int) {
	r.t.Helper()
	require.Eventually(r.t, func() bool { return r.countKind(kind) >= n }, scWaitFor, scPollGap, "%d %s entries", n, kind)
	require.Equal(r.t, n, r.countKind(kind), "exactly %d %s entries", n, kind)
}

// refused asserts err is the ledger's refusal with the sentinel want.
func requireRefused(t *testing.T, err error, want error, what string) *protocol.Error {
	t.Helper()
	require.ErrorIs(t, err, want, what)
	le, ok := protocol.AsError(err)
	require.True(t, ok, "%s: a protocol error", what)
	require.NotZero(t, le.Seq, "%s: the refusal is recorded as a rejection entry", what)
	return le
}

// export writes the whole ledger to path and returns the trailer.
func (r *replayRig) export(path string) stream.ExportTrailer {
	r.t.Helper()
	f, err := os.Create(path)
	require.NoError(r.t, err)
	tr, err := r.L.Export(r.ctx(), f, 1)
	require.NoError(r.t, err)
	require.NoError(r.t, f.Close())
	require.NotZero(r.t, tr.Count)
	return tr
}

// ---- views collected from a projected store ----

// inboxView is one agent's whole Inbox (every state).
type inboxView struct {
	ProjectID string                 `json:"project_id"`
	AgentID   string                 `json:"agent_id"`
	Items     []projector.InboxEntry `json:"items"`
}

// viewsGolden is the <name>.timelines.json golden: every turn's timeline and
// every agent's Inbox, sorted by project then turn or agent.
type viewsGolden struct {
	Timelines []*projector.Timeline `json:"timelines"`
	Inboxes   []inboxView           `json:"inboxes"`
}

// viewKeys finds every (project, turn) with a timeline and every (project,
// agent) known to the views (roster, inbox, or call index), from the key
// layout of docs/views.md: tag \0 parts \0 ..., integers 8-byte big-endian.
func viewKeys(store *projector.Store) (turns, agents [][2]string, err error) {
	seenT, seenA := map[[2]string]bool{}, map[[2]string]bool{}
	// tail strips n trailing bytes and splits the rest after prefix on \0.
	parts := func(k []byte, prefix string, tail int) []string {
		if !bytes.HasPrefix(k, []byte(prefix)) || len(k) < len(prefix)+tail {
			return nil
		}
		return strings.Split(string(k[len(prefix):len(k)-tail]), "\x00")
	}
	err = store.Dump(func(k, _ []byte) error {
		// tl\0<project>\0<turn>\0<tool_call_id or empty>\0<seq>
		if p := parts(k, "tl\x00", 9); len(p) == 3 {
			seenT[[2]string{p[0], p[1]}] = true
		}
		for _, tag := range []string{"inbox\x00", "roster\x00"} {
			if p := parts(k, tag, 9); len(p) == 2 {
				seenA[[2]string{p[0], p[1]}] = true
			}
		}
		// ix\0<project>\0<dimension>\0<value>\0<ns>\0<seq>
		if p := parts(k, "ix\x00", 18); len(p) == 3 && p[1] == "agent" {
			seenA[[2]string{p[0], p[2]}] = true
		}
		return nil
	})
	sorted := func(m map[[2]string]bool) [][2]string {
		out := make([][2]string, 0, len(m))
		for k := range m {
			out = append(out, k)
		}
		sort.Slice(out, func(i, j int) bool {
			if out[i][0] != out[j][0] {
				return out[i][0] < out[j][0]
			}
			return out[i][1] < out[j][1]
		})
		return out
	}
	return sorted(seenT), sorted(seenA), err
}

func collectViews(store *projector.Store, q *projector.Queries) (*viewsGolden, error) {
	turns, agents, err := viewKeys(store)
	if err != nil {
		return nil, err
	}
	v := &viewsGolden{Timelines: []*projector.Timeline{}, Inboxes: []inboxView{}}
	for _, pt := range turns {
		tl, err := q.Timeline(pt[0], pt[1], projector.AsOf{})
		if err != nil {
			return nil, fmt.Errorf("timeline %s/%s: %w", pt[0], pt[1], err)
		}
		v.Timelines = append(v.Timelines, tl)
	}
	for _, pa := range agents {
		ib := inboxView{ProjectID: pa[0], AgentID: pa[1], Items: []projector.InboxEntry{}}
		cursor := ""
		for {
			page, err := q.Inbox(pa[0], pa[1], "all", projector.AsOf{}, cursor, projector.MaxLimit)
			if err != nil {
				return nil, fmt.Errorf("inbox %s/%s: %w", pa[0], pa[1], err)
			}
			ib.Items = append(ib.Items, page.Items...)
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		v.Inboxes = append(v.Inboxes, ib)
	}
	return v, nil
}

// viewRow is one view row (key and value).
type viewRow struct{ K, V []byte }

func dumpRows(store *projector.Store) ([]viewRow, error) {
	var rows []viewRow
	err := store.Dump(func(k, v []byte) error {
		rows = append(rows, viewRow{append([]byte(nil), k...), append([]byte(nil), v...)})
		return nil
	})
	return rows, err
}

// stableJSON is the golden encoding: indented, HTML left alone, a final
// newline. Maps encode with sorted keys, slices keep their (ledger) order.
func stableJSON(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	require.NoError(t, enc.Encode(v))
	return buf.Bytes()
}

// digestFile is the <name>.digest golden.
type digestFile struct {
	Entries    uint64 `json:"entries"`
	AppliedSeq uint64 `json:"applied_seq"`
	Digest     string `json:"digest"`
	ChainHead  string `json:"chain_head"`
}

// replayed is what one replay of an export produced.
type replayed struct {
	res   *replay.Result
	views *viewsGolden
	rows  []viewRow
}

func (p *replayed) digestFile() digestFile {
	return digestFile{Entries: p.res.Entries, AppliedSeq: p.res.AppliedSeq, Digest: p.res.Digest, ChainHead: p.res.ChainHead}
}

// replayFile replays an export in a fresh directory with replay.Run and
// collects the views (and, with rows, every view row).
func replayFile(t *testing.T, path string, rows bool) *replayed {
	t.Helper()
	out := &replayed{}
	res, err := replay.Run(ledgertest.Ctx(t), path, replay.Options{Dir: t.TempDir(), Inspect: func(store *projector.Store, q *projector.Queries) error {
		var err error
		if out.views, err = collectViews(store, q); err != nil {
			return err
		}
		if rows {
			out.rows, err = dumpRows(store)
		}
		return err
	}})
	require.NoError(t, err, "replay %s", path)
	require.True(t, res.File.OK, "replay %s: file verifies", path)
	require.Equal(t, res.Entries, res.AppliedSeq, "replay %s: every entry projected", path)
	out.res = res
	return out
}

// ---- shapes: what must not change between two recordings of a script ----

// fileShape is an export's entry kinds and subjects, in ledger order.
func fileShape(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []string
	_, tr, err := stream.ReadExport(f, nil, func(e stream.ExportEntry) error {
		out = append(out, fmt.Sprintf("%d %s %s", e.Seq, entryKind(e.Headers), e.Subject))
		return nil
	})
	require.NoError(t, err)
	require.NotNil(t, tr, "%s has a trailer", path)
	return out
}

// viewsShape is each timeline's entry kinds and each Inbox's calls with
// their status, effective after_execution and state: everything in the
// views but times, trace ids and sequence-dependent data.
func viewsShape(v *viewsGolden) []string {
	var out []string
	for _, tl := range v.Timelines {
		kinds := make([]string, len(tl.Items))
		for i, it := range tl.Items {
			kinds[i] = it.Kind
		}
		out = append(out, fmt.Sprintf("timeline %s/%s: %s", tl.ProjectID, tl.AgentTurnID, strings.Join(kinds, " ")))
	}
	for _, ib := range v.Inboxes {
		items := make([]string, len(ib.Items))
		for i, it := range ib.Items {
			items[i] = fmt.Sprintf("%s/%s=%s,%s,%s", it.AgentTurnID, it.ToolCallID, it.Status, it.EffectiveAfterExecution, it.State)
		}
		out = append(out, fmt.Sprintf("inbox %s/%s: %s", ib.ProjectID, ib.AgentID, strings.Join(items, " ")))
	}
	return out
}

func readViews(t *testing.T, path string) *viewsGolden {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err, "golden %s (regenerate: go test ./test -run TestRecordScenarios -update)", path)
	var v viewsGolden
	require.NoError(t, json.Unmarshal(b, &v))
	return &v
}

// firstRowDiff describes the first difference between two row sets.
func firstRowDiff(a, b []viewRow) string {
	for i := 0; i < len(a) && i < len(b); i++ {
		if !bytes.Equal(a[i].K, b[i].K) || !bytes.Equal(a[i].V, b[i].V) {
			return fmt.Sprintf("row %d: key %q value %q vs key %q value %q", i, a[i].K, a[i].V, b[i].K, b[i].V)
		}
	}
	if len(a) != len(b) {
		return fmt.Sprintf("%d rows vs %d rows", len(a), len(b))
	}
	return ""
}

// copyFile copies src to dst through a temporary file and a rename, so a
// golden is never left half written.
func copyGolden(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeGolden(dst, b)
}

func writeGolden(dst string, b []byte) error {
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}

func goldenPath(name, ext string) string { return filepath.Join(testdataDir, name+ext) }
