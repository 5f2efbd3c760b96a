package faults

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/protocol"
)

// The checker, in the manner of Jepsen: a load generator records, for every
// call it attempts, whether the ledger acknowledged it (a dispatch answered
// with success, on the first attempt or on a retry of the same request).
// Once the faults are over and the system is healthy again, the ledger's
// export is read and every call is judged:
//
//   - lost: acknowledged, but no report entry after recovery;
//   - duplicated: more than one report entry for one call;
//   - stuck: not acknowledged, yet its command is in the ledger (so a tool
//     ran or will run it), and no report after recovery;
//   - unexpected: a report for a call the load never made.
//
// A call neither acknowledged nor in the ledger is indeterminate and fine.

const (
	attemptTimeout = 5 * time.Second  // per dispatch attempt (docs/durability.md)
	retryFor       = 90 * time.Second // how long a call is retried before giving up
	loadWorkers    = 8
)

type callKey struct{ project, turn, call string }

func (k callKey) String() string { return k.project + "/" + k.turn + "/" + k.call }

type callRecord struct {
	key      callKey
	attempts int
	acked    bool
	refused  string // a refusal (not retried); the same request must never be refused
	lastErr  string
}

type loadSpec struct {
	nc      *nats.Conn
	project string
	channel string
	agent   string
	tool    string // tool_name of the card and command
	target  string // the command subject's tool target
	calls   int    // at least this many calls, and more until the faults are over
	runID   string
	// gate, when set, holds new calls back while it is false (a tool service
	// that falls behind).
	gate func(*load) bool
}

// load is a running load generator: loadWorkers goroutines dispatching
// distinct calls at up to loadRate per second, each retried as
// docs/durability.md says until acknowledged or refused, or for retryFor.
// It goes on until the faults are over (faultsDone) and at least spec.calls
// calls were started.
type load struct {
	t          *testing.T
	spec       loadSpec
	client     *client.Client
	next       atomic.Int64
	started    atomic.Int64
	acked      atomic.Int64
	retries    atomic.Int64
	faultsOver atomic.Bool
	mu         sync.Mutex
	records    []*callRecord // by call index; nil until started
	done       chan struct{}
}

const (
	loadRate = 150 // calls per second, at most
	// maxCallsFactor bounds a run: at most this many times spec.calls.
	maxCallsFactor = 40
)

func startLoad(t *testing.T, spec loadSpec) *load {
	l := &load{t: t, spec: spec, client: client.New(spec.nc), done: make(chan struct{}),
		records: make([]*callRecord, spec.calls*maxCallsFactor)}
	ctx, cancel := context.WithCancel(context.Background())
	pace := time.NewTicker(time.Second / loadRate)
	var wg sync.WaitGroup
	for range loadWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				// Pacing and back-pressure shape the load; they synchronise nothing.
				select {
				case <-pace.C:
				case <-ctx.Done():
					return
				}
				for spec.gate != nil && !spec.gate(l) && ctx.Err() == nil {
					select {
					case <-pace.C:
					case <-ctx.Done():
					}
				}
				i := int(l.next.Add(1)) - 1
				if i >= len(l.records) || (i >= spec.calls && l.faultsOver.Load()) || ctx.Err() != nil {
					return
				}
				l.mu.Lock()
				l.records[i] = &callRecord{key: callKey{spec.project, fmt.Sprintf("t-%s-%d", spec.runID, i/4), fmt.Sprintf("c-%d", i)}}
				l.mu.Unlock()
				l.started.Add(1)
				l.call(ctx, i)
			}
		}()
	}
	go func() {
		wg.Wait()
		pace.Stop()
		close(l.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-l.done
	})
	return l
}

func (l *load) Started() int { return int(l.started.Load()) }

func (l *load) Acked() int { return int(l.acked.Load()) }

func (l *load) finished() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// waitDone ends the load (the faults are over) and waits until every call
// was attempted and answered or given up.
func (l *load) waitDone() {
	l.t.Helper()
	l.faultsOver.Store(true)
	require.True(l.t, waitFor(retryFor+readyTimeout, l.finished), "the load generator finishes")
}

func (l *load) request(i int) protocol.DispatchRequest {
	l.mu.Lock()
	k := l.records[i].key
	l.mu.Unlock()
	sum := sha256.Sum256([]byte(k.project + "\x00" + k.turn + "\x00" + k.call))
	cardID := "cc-" + hex.EncodeToString(sum[:12])
	return protocol.DispatchRequest{
		Subject:  protocol.ToolCommandSubject(protocol.DefaultVersion, k.project, l.spec.channel, l.spec.target),
		Identity: protocol.Identity{AgentID: l.spec.agent, AgentTurnID: k.turn, TurnEpoch: 1, ToolCallID: k.call},
		Card: protocol.Card{CardID: cardID, ProjectID: k.project, Type: protocol.CardToolCall, AuthorID: l.spec.agent,
			AgentTurnID: k.turn, ToolCallID: k.call,
			Content:  json.RawMessage(fmt.Sprintf(`{"tool_name":%q,"arguments":{"text":"call %d of %s"}}`, l.spec.tool, i, l.spec.runID)),
			Metadata: protocol.CardMetadata{TraceID: hex.EncodeToString(sum[12:28]), ParentStepID: k.turn, StepID: "s-" + k.call}},
		// A long deadline (capped at the tool's maximum): these tests
		// count non-success outcomes, and a call held by a killed process
		// can wait out an ack wait and a restart.
		Payload: protocol.ToolCommandPayload{ToolCallCardID: cardID, ToolName: l.spec.tool, AfterExecution: protocol.AfterSuspend, TimeoutMS: 300_000},
	}
}

// call dispatches call i until it is acknowledged or refused, retrying the
// same request on timeouts, "no responders", lost connections and
// `internal`, with backoff from 100 ms doubling to 2 s, for retryFor.
func (l *load) call(ctx context.Context, i int) {
	l.mu.Lock()
	rec := l.records[i]
	l.mu.Unlock()
	req := l.request(i)
	giveUp := time.Now().Add(retryFor)
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		_, err := l.client.Dispatch(actx, req)
		cancel()
		l.mu.Lock()
		rec.attempts = attempt
		if err == nil {
			rec.acked = true
			l.mu.Unlock()
			l.acked.Add(1)
			return
		}
		var le *protocol.Error
		if errors.As(err, &le) && le.Code != protocol.CodeInternal {
			rec.refused = string(le.Code) + ": " + le.Message
			l.mu.Unlock()
			return
		}
		rec.lastErr = err.Error()
		l.mu.Unlock()
		if time.Now().After(giveUp) || ctx.Err() != nil {
			return
		}
		l.retries.Add(1)
		// Retry backoff, not a synchronisation.
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// ledgerView is what an export says about calls.
type ledgerView struct {
	entries  int
	commands map[callKey]int
	reports  map[callKey][]string // the status of each report entry
}

type exportLine struct {
	Seq     uint64              `json:"seq"`
	Subject string              `json:"subject"`
	Headers map[string][]string `json:"headers"`
	Data    string              `json:"data"`
	JSON    json.RawMessage     `json:"json"`
	End     bool                `json:"end"`
	Count   int                 `json:"count"`
}

func header(h map[string][]string, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// parseExport reads an export file (docs/tamper-evidence.md).
func parseExport(raw []byte) (*ledgerView, error) {
	v := &ledgerView{commands: map[callKey]int{}, reports: map[callKey][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	sawEnd := false
	for sc.Scan() {
		var e exportLine
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("export line %q: %w", sc.Text(), err)
		}
		if e.End {
			if e.Count != v.entries {
				return nil, fmt.Errorf("export trailer counts %d entries, file has %d", e.Count, v.entries)
			}
			sawEnd = true
			continue
		}
		if e.Subject == "" {
			continue // the header line
		}
		v.entries++
		tok := strings.Split(e.Subject, ".")
		switch header(e.Headers, protocol.HeaderEntryKind) {
		case "command":
			if len(tok) < 3 {
				return nil, fmt.Errorf("command on subject %q", e.Subject)
			}
			k := callKey{tok[2], header(e.Headers, protocol.HeaderAgentTurnID), header(e.Headers, protocol.HeaderToolCallID)}
			v.commands[k]++
		case "report":
			// cg.v1.<p>.<c>.ledger.report.<turn>.<call>
			if len(tok) != 8 || tok[4] != "ledger" || tok[5] != "report" {
				return nil, fmt.Errorf("report on subject %q", e.Subject)
			}
			k := callKey{tok[2], tok[6], tok[7]}
			// Version 2 keeps JSON payloads as JSON ("json"), other bytes
			// as base64 ("data").
			data := []byte(e.JSON)
			if e.JSON == nil {
				var err error
				if data, err = base64.StdEncoding.DecodeString(e.Data); err != nil {
					return nil, fmt.Errorf("report seq %d: data: %w", e.Seq, err)
				}
			}
			var r struct {
				Status string `json:"status"`
			}
			if err := json.Unmarshal(data, &r); err != nil {
				return nil, fmt.Errorf("report seq %d: %w", e.Seq, err)
			}
			v.reports[k] = append(v.reports[k], r.Status)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !sawEnd {
		return nil, errors.New("export has no trailer")
	}
	return v, nil
}

// exportVia runs `cgledger export` against s (which verifies the hash chain
// before it keeps the file) and reads the file.
func exportVia(s *serve) (*ledgerView, error) {
	out := filepath.Join(s.t.TempDir(), "ledger.jsonl")
	stdout, stderr, code := s.cli("export", "--out", out)
	if code != 0 {
		return nil, fmt.Errorf("cgledger export: exit %d: %s %s", code, stdout, stderr)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	return parseExport(raw)
}

type verdict struct {
	attempted, acknowledged, lost, duplicated, stuck           int
	unacked, refused, unexpected, nonSuccess, retries, entries int
	problems                                                   []string
}

func (v *verdict) problem(format string, args ...any) {
	if len(v.problems) < 20 {
		v.problems = append(v.problems, fmt.Sprintf(format, args...))
	}
}

// judge compares the load's history with the ledger.
func (l *load) judge(view *ledgerView) verdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := verdict{retries: int(l.retries.Load()), entries: view.entries}
	known := map[callKey]bool{}
	for _, r := range l.records {
		if r == nil {
			continue
		}
		known[r.key] = true
		if r.attempts == 0 {
			continue
		}
		v.attempted++
		reports := view.reports[r.key]
		if r.acked {
			v.acknowledged++
		} else {
			v.unacked++
		}
		if r.refused != "" {
			v.refused++
			v.problem("refused %s: %s", r.key, r.refused)
		}
		switch {
		case len(reports) > 1:
			v.duplicated++
			v.problem("duplicated %s: %d reports %v", r.key, len(reports), reports)
		case len(reports) == 0 && r.acked:
			v.lost++
			v.problem("lost %s: acknowledged after %d attempt(s), %d command(s) in the ledger, no report", r.key, r.attempts, view.commands[r.key])
		case len(reports) == 0 && view.commands[r.key] > 0:
			v.stuck++
			v.problem("stuck %s: %d command(s), no report (not acknowledged: %s)", r.key, view.commands[r.key], r.lastErr)
		}
		for _, st := range reports {
			if st != protocol.StatusSuccess {
				v.nonSuccess++
			}
		}
	}
	var phantom []string
	for k := range view.reports {
		if !known[k] {
			phantom = append(phantom, k.String())
		}
	}
	sort.Strings(phantom)
	v.unexpected = len(phantom)
	for _, k := range phantom {
		v.problem("unexpected report %s", k)
	}
	return v
}

func (v verdict) line(name string, kills int) string {
	return fmt.Sprintf("checker: %s seed=%d kills=%d attempted=%d acknowledged=%d lost=%d duplicated=%d stuck=%d (unacknowledged=%d refused=%d unexpected=%d non_success=%d retries=%d entries=%d)",
		name, seed, kills, v.attempted, v.acknowledged, v.lost, v.duplicated, v.stuck,
		v.unacked, v.refused, v.unexpected, v.nonSuccess, v.retries, v.entries)
}

// settleAndCheck waits (with the system healthy) until every acknowledged
// or dispatched call has its report, or settleTimeout passes, then judges
// the final export, prints the checker's line and fails on any anomaly.
func (l *load) settleAndCheck(kills int, export func() (*ledgerView, error)) verdict {
	t := l.t
	t.Helper()
	l.waitDone()
	var lastErr error
	waitFor(settleTimeout, func() bool {
		view, err := export()
		if err != nil {
			lastErr = err
			return false
		}
		v := l.judge(view)
		return v.lost == 0 && v.stuck == 0
	})
	view, err := export()
	require.NoError(t, err, "final export (last error while settling: %v)", lastErr)
	v := l.judge(view)
	t.Log(v.line(t.Name(), kills))
	for _, p := range v.problems {
		t.Log("  ", p)
	}
	require.GreaterOrEqual(t, v.attempted, l.spec.calls, "every call was attempted")
	require.Equal(t, l.Started(), v.attempted, "every call started was attempted")
	require.Positive(t, v.acknowledged, "some calls were acknowledged")
	require.Zero(t, v.lost, "lost calls (acknowledged, no report)")
	require.Zero(t, v.duplicated, "duplicated calls (more than one report)")
	require.Zero(t, v.stuck, "stuck calls (command in the ledger, no report)")
	require.Zero(t, v.unexpected, "reports of calls never made")
	require.Zero(t, v.refused, "a retried dispatch was refused")
	return v
}

// TestCheckerCountsAnomalies feeds the checker a history and an export with
// one call of each kind, so a checker that sees nothing cannot pass.
func TestCheckerCountsAnomalies(t *testing.T) {
	t.Parallel()
	l := &load{t: t, spec: loadSpec{project: project, calls: 7}}
	rec := func(call string, acked bool, refused string) {
		l.records = append(l.records, &callRecord{key: callKey{project, "t1", call}, attempts: 1, acked: acked, refused: refused})
	}
	rec("ok", true, "")                // one report
	rec("lost", true, "")              // acknowledged, command, no report
	rec("dup", true, "")               // two reports
	rec("stuck", false, "")            // not acknowledged, command, no report
	rec("unknown", false, "")          // not acknowledged, not in the ledger: fine
	rec("late", false, "")             // not acknowledged, yet reported: fine
	rec("no", false, "no: x")          // refused
	l.records = append(l.records, nil) // a call index never started

	var lines []string
	entry := func(kind, subject, call, status string) {
		data := base64.StdEncoding.EncodeToString([]byte(`{"status":"` + status + `"}`))
		b, err := json.Marshal(map[string]any{"seq": len(lines), "subject": subject, "data": data,
			"headers": map[string][]string{"CG-Entry-Kind": {kind}, "CG-Agent-Turn-Id": {"t1"}, "CG-Tool-Call-Id": {call}}})
		require.NoError(t, err)
		lines = append(lines, string(b))
	}
	lines = append(lines, `{"format":"cgledger.export","version":1,"stream":"CG_LEDGER","from_seq":1,"prev_link":"00"}`)
	for _, c := range []string{"ok", "lost", "dup", "stuck", "late"} {
		entry("command", "cg.v1."+project+".main.cmd.tool.echo", c, "")
	}
	for _, c := range []string{"ok", "dup", "dup", "late", "phantom"} {
		entry("report", "cg.v1."+project+".main.ledger.report.t1."+c, c, "success")
	}
	entry("report", "cg.v1."+project+".main.ledger.report.t1.failed", "failed", "timeout")
	body := strings.Join(lines, "\n") + "\n"

	view, err := parseExport([]byte(body + `{"end":true,"count":11,"last_seq":11}` + "\n"))
	require.NoError(t, err)
	v := l.judge(view)
	t.Log(v.line(t.Name(), 0))
	require.Equal(t, verdict{attempted: 7, acknowledged: 3, lost: 1, duplicated: 1, stuck: 1, unacked: 4, refused: 1,
		unexpected: 2, nonSuccess: 0, entries: 11}, verdict{attempted: v.attempted, acknowledged: v.acknowledged,
		lost: v.lost, duplicated: v.duplicated, stuck: v.stuck, unacked: v.unacked, refused: v.refused,
		unexpected: v.unexpected, nonSuccess: v.nonSuccess, entries: v.entries})
	require.Len(t, v.problems, 6)

	_, err = parseExport([]byte(body))
	require.ErrorContains(t, err, "no trailer", "a truncated export is refused")
	_, err = parseExport([]byte(body + `{"end":true,"count":12,"last_seq":12}` + "\n"))
	require.ErrorContains(t, err, "counts 12 entries", "a short export is refused")
}
