package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/protocol"
)

// TestFullDiskResumesWhenSpaceReturns runs serve with its reserve on a disk
// that was already nearly full when it started (as after a restart in
// place, or an operator's restart, on a full disk), fills the rest with
// calls until writes are refused, then frees space by deleting a file: no
// restart. /readyz and cgledger_storage_degraded must say "not ready" while
// writes are refused, "ready" only once a write succeeds, and every call
// the ledger acknowledged gets its report and its wakeup.
//
// The views are left out (roles api and executor): the stream's own bytes
// are then what fills the disk, so a storage limit that nats-server derived
// from the free space at start is met before the reserve, as in the field.
func TestFullDiskResumesWhenSpaceReturns(t *testing.T) {
	data := mountTmpfs(t, 48)
	filler := fillTo(t, data, 32<<20)
	s := startServer(t, data, servetest.FreePort(t), servetest.FreePort(t), "--disk-reserve", "4MiB", "--roles", "api,executor")
	ld := newLoader(t, s)

	ld.untilRefused(t)
	requireNotReady(t, s, ld)

	require.NoError(t, os.Remove(filler))
	requireResumes(t, s, ld)
}

// TestFullDiskWithoutReserveResumesWhenSpaceReturns turns the reserve off
// and fills the disk to the last byte under load, so that the stores meet
// "no space left" and serve restarts itself in place. A little space comes
// back first (serve restarts on a nearly full disk), then the rest: at each
// step serve is ready only when a write succeeds, and once space is back
// every acknowledged call gets its report and its wakeup, without a restart
// by hand.
func TestFullDiskWithoutReserveResumesWhenSpaceReturns(t *testing.T) {
	data := mountTmpfs(t, 64)
	small := filepath.Join(data, "small")
	require.NoError(t, os.WriteFile(small, make([]byte, 2<<20), 0o600))
	s := startServer(t, data, servetest.FreePort(t), servetest.FreePort(t), "--disk-reserve", "off")
	ld := newLoader(t, s)

	// Enough history that a storage limit derived from a few free MiB at
	// a restart would be below what the stream already holds.
	ld.start(t)
	require.Eventually(t, func() bool { return dirSize(t, filepath.Join(data, "jetstream")) >= 8<<20 },
		time.Minute, 50*time.Millisecond, "the stream grows under load")
	filler := fillTo(t, data, 0)
	require.Eventually(t, func() bool {
		topUp(t, filler)
		code, _ := readiness(t, s)
		return code != http.StatusOK && ld.refusals() > 0
	}, time.Minute, 50*time.Millisecond, "serve reports the full disk")
	ld.stop()
	require.Eventually(t, func() bool {
		topUp(t, filler)
		return strings.Contains(s.Log.String(), "could not write to disk") || strings.Contains(s.Log.String(), "view store broken")
	}, time.Minute, 50*time.Millisecond, "a store met the full disk")
	requireNotReady(t, s, ld)

	// A few MiB come back: serve restarts itself in place on a nearly full
	// disk. Either its stores reopen in that room, and once it says ready
	// writes go through; or the view store's write-ahead log needs more
	// room to flush than came back, and serve, not ready, says it waits.
	require.NoError(t, os.Remove(small))
	require.Eventually(t, func() bool { return strings.Contains(s.Log.String(), "restarting serve in place") },
		time.Minute, 50*time.Millisecond, "serve restarts itself once there is room")
	waits := false
	require.Eventually(t, func() bool {
		if code, _ := readiness(t, s); code == http.StatusOK {
			return true
		}
		log := s.Log.String()
		waits = strings.Contains(log[strings.LastIndex(log, "restarting serve in place"):], "view store: a background write failed")
		return waits
	}, time.Minute, 50*time.Millisecond, "serve is ready on the room that came back, or says what it waits for")
	if waits {
		t.Log("the view store waits for more room to flush its write-ahead log")
		code, _ := readiness(t, s)
		require.Equal(t, http.StatusServiceUnavailable, code, "not ready while a store cannot open")
	} else {
		waitReady(t, s, ld)
		_, err := ld.dispatch("after-restart")
		require.NoError(t, err, "ready means a write succeeds")
	}

	require.NoError(t, os.Remove(filler))
	requireResumes(t, s, ld)
}

// loader dispatches echo calls with 8 KiB arguments, as the admin, from a
// few goroutines, and remembers which ones the ledger acknowledged.
type loader struct {
	s *server

	cmu sync.Mutex
	cl  *client.Client
	nc  *nats.Conn

	mu      sync.Mutex
	acked   []string
	refused int
	lastErr error

	halt chan struct{}
	wg   sync.WaitGroup
	next int
}

func newLoader(t *testing.T, s *server) *loader {
	t.Helper()
	ld := &loader{s: s}
	require.NoError(t, ld.connect(nil))
	t.Cleanup(func() {
		ld.cmu.Lock()
		defer ld.cmu.Unlock()
		ld.nc.Close()
	})
	return ld
}

// connect (re)connects as the admin, unless another dispatch already
// replaced old. serve writes a new admin credential, with a new inbox
// prefix, each time it starts (a restart in place too).
func (ld *loader) connect(old *client.Client) error {
	ld.cmu.Lock()
	defer ld.cmu.Unlock()
	if ld.cl != old {
		return nil
	}
	creds := filepath.Join(ld.s.Data, "auth", "admin.creds")
	_, inbox, err := auth.ReadCreds(creds)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(ld.s.natsURL(), nats.UserCredentials(creds), nats.CustomInboxPrefix(inbox), nats.NoReconnect())
	if err != nil {
		return err
	}
	if ld.nc != nil {
		ld.nc.Close()
	}
	ld.nc, ld.cl = nc, client.New(nc, client.WithActor("alice"), client.WithTimeout(10*time.Second))
	return nil
}

func (ld *loader) client() *client.Client {
	ld.cmu.Lock()
	defer ld.cmu.Unlock()
	return ld.cl
}

var loadArgs = `{"text":"` + strings.Repeat("x", 8<<10) + `"}`

// dispatch makes one call; nil means the ledger acknowledged it.
func (ld *loader) dispatch(id string) (string, error) {
	turn := "load"
	sum := sha256.Sum256([]byte("demo\x00" + turn + "\x00" + id))
	cardID := "cc-" + hex.EncodeToString(sum[16:28])
	trace := hex.EncodeToString(sum[:16])
	req := protocol.DispatchRequest{
		Subject:  protocol.ToolCommandSubject(protocol.DefaultVersion, "demo", "main", "echo"),
		Identity: protocol.Identity{AgentID: "alice", AgentTurnID: turn, TurnEpoch: 1, ToolCallID: id, Traceparent: "00-" + trace + "-" + trace[:16] + "-01"},
		Card: protocol.Card{CardID: cardID, ProjectID: "demo", Type: protocol.CardToolCall, AuthorID: "alice", AgentTurnID: turn, ToolCallID: id,
			Content:  json.RawMessage(`{"tool_name":"echo","arguments":` + loadArgs + `}`),
			Metadata: protocol.CardMetadata{TraceID: trace, ParentStepID: turn, StepID: "step-" + id}},
		Payload: protocol.ToolCommandPayload{ToolCallCardID: cardID, ToolName: "echo", AfterExecution: protocol.AfterSuspend, TimeoutMS: 30000},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cl := ld.client()
	_, err := cl.Dispatch(ctx, req)
	if _, ledgerAnswered := protocol.AsError(err); err != nil && !ledgerAnswered {
		// No answer from the ledger (serve restarting in place, a stale
		// credential): connect again for the next dispatch.
		_ = ld.connect(cl)
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if err == nil {
		ld.acked = append(ld.acked, id)
	} else {
		ld.refused++
		ld.lastErr = err
	}
	return id, err
}

// start runs the load until stop.
func (ld *loader) start(t *testing.T) {
	t.Helper()
	halt := make(chan struct{})
	ld.halt = halt
	for w := range 4 {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			for {
				select {
				case <-halt:
					return
				default:
				}
				_, _ = ld.dispatch("w" + strconv.Itoa(w) + "-" + strconv.Itoa(ld.seq()))
			}
		}()
	}
	t.Cleanup(ld.stop)
}

func (ld *loader) seq() int {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.next++
	return ld.next
}

func (ld *loader) stop() {
	if ld.halt == nil {
		return
	}
	close(ld.halt)
	ld.halt = nil
	ld.wg.Wait()
}

func (ld *loader) refusals() int {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.refused
}

// untilRefused loads until writes are refused, and stops.
func (ld *loader) untilRefused(t *testing.T) {
	t.Helper()
	ld.start(t)
	require.Eventually(t, func() bool { return ld.refusals() >= 8 }, time.Minute, 20*time.Millisecond, "writes are refused once the disk is full")
	ld.stop()
	ld.mu.Lock()
	defer ld.mu.Unlock()
	require.NotEmpty(t, ld.acked, "calls were acknowledged before the disk filled")
	t.Logf("%d calls acknowledged, %d refused; last refusal: %v", len(ld.acked), ld.refused, ld.lastErr)
}

// requireNotReady checks that while a write is refused, serve says so.
func requireNotReady(t *testing.T, s *server, ld *loader) {
	t.Helper()
	_, err := ld.dispatch("while-full")
	require.Error(t, err, "the disk is still full")
	code, reason := readiness(t, s)
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready while a write is refused (%v); reason %q", err, reason)
	require.Equal(t, 1.0, metricValue(t, s, "cgledger_storage_degraded"), "degraded while a write is refused (%v)", err)
}

// waitReady waits until serve says it is ready, and connects the loader
// afresh (serve may have restarted in place meanwhile, with a new admin
// credential).
func waitReady(t *testing.T, s *server, ld *loader) {
	t.Helper()
	require.Eventually(t, func() bool {
		code, _ := readiness(t, s)
		return code == http.StatusOK
	}, time.Minute, 50*time.Millisecond, "serve is ready again once the disk has room")
	require.NoError(t, ld.connect(ld.client()))
}

// requireResumes checks that serve, once ready again, takes writes, and
// that every acknowledged call gets exactly one report and one wakeup.
func requireResumes(t *testing.T, s *server, ld *loader) {
	t.Helper()
	waitReady(t, s, ld)
	_, err := ld.dispatch("after")
	require.NoError(t, err, "ready means a write succeeds")
	require.Equal(t, 0.0, metricValue(t, s, "cgledger_storage_degraded"))
	ld.mu.Lock()
	acked := append([]string(nil), ld.acked...)
	ld.mu.Unlock()
	var reports, wakeups map[string]int
	done := func() bool {
		reports, wakeups = callEntries(t, s)
		for _, id := range acked {
			if reports[id] == 0 || wakeups[id] == 0 {
				return false
			}
		}
		return true
	}
	// Polled here rather than in require.Eventually: each poll runs the
	// export verb, which asserts in the test's goroutine.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for deadline := time.Now().Add(time.Minute); !done(); <-tick.C {
		require.True(t, time.Now().Before(deadline), "every acknowledged call is reported and woken within a minute")
	}
	for _, id := range acked {
		require.Equal(t, 1, reports[id], "reports of %s", id)
		require.Equal(t, 1, wakeups[id], "wakeups of %s", id)
	}
	t.Logf("%d acknowledged calls reported and woken", len(acked))
}

// callEntries counts report and wakeup (or wakeup_skipped) entries by
// tool_call_id, from an export of the whole ledger.
func callEntries(t *testing.T, s *server) (reports, wakeups map[string]int) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "ledger.jsonl")
	if msg, code := s.run(t, "export", "--out", out); code != 0 {
		t.Logf("export: %s", msg)
		return nil, nil
	}
	f, err := os.Open(out)
	require.NoError(t, err)
	defer f.Close()
	reports, wakeups = map[string]int{}, map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var e struct {
			Headers map[string][]string `json:"headers"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e))
		kind, id := first(e.Headers[protocol.HeaderEntryKind]), first(e.Headers[protocol.HeaderToolCallID])
		switch protocol.EntryKind(kind) {
		case protocol.KindReport:
			reports[id]++
		case protocol.KindWakeup, protocol.KindWakeupSkipped:
			wakeups[id]++
		}
	}
	require.NoError(t, sc.Err())
	return reports, wakeups
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// metricValue reads an unlabelled gauge or counter from /metrics.
func metricValue(t *testing.T, s *server, name string) float64 {
	t.Helper()
	resp, err := http.Get(s.httpURL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	require.NoError(t, sc.Err())
	require.Fail(t, fmt.Sprintf("metric %s not found", name))
	return 0
}

// dirSize sums the sizes of the files under dir.
func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, ierr := d.Info(); ierr == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
