package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/cgledger/cgledger/stream"
)

// DefaultMemoryRate is the recording rate of Config.Memory when Config.Rate
// is zero, in calls per second: below what this 2-core machine records at
// full speed (about 1300 calls/s idle), so the pace, not the machine, sets
// how many calls the window holds.
const DefaultMemoryRate = 1000

// MemorySample is the process's memory after some calls were recorded.
type MemorySample struct {
	Calls int `json:"calls"`
	// ElapsedS is the seconds since the first call was recorded.
	ElapsedS float64 `json:"elapsed_s"`
	// RSSMB is the resident set (VmRSS) as found, before any collection:
	// with serve's gc_percent (400) the heap grows towards memory_limit
	// between collections, so this shows the limit more than what is held.
	RSSMB float64 `json:"rss_mb"`
	// HeldMB is the resident set right after a collection that returned
	// every free page to the system (debug.FreeOSMemory): what the process
	// holds, Go heap and the rest (stacks, Pebble's manual memory, the
	// runtime's own).
	HeldMB float64 `json:"rss_held_mb"`
	// HeapMB is the live Go heap right after that collection.
	HeapMB float64 `json:"heap_live_mb"`
	// GoMB is what the Go runtime then keeps from the system (Sys less
	// HeapReleased: heap spans in use, stacks, GC metadata); HeldMB less
	// GoMB is the rest, chiefly Pebble's block cache and memtables (C
	// memory with cgo) and the binary.
	GoMB float64 `json:"go_runtime_mb"`
	// StreamEntries and StreamSubjects are what the ledger stream holds
	// (the window), StreamCalls the entries as calls (entries / entries per
	// call so far).
	StreamEntries  uint64  `json:"stream_entries"`
	StreamSubjects uint64  `json:"stream_subjects"`
	StreamCalls    float64 `json:"stream_calls"`
	// ArchivedSeq is the last sequence in a sealed archive segment.
	ArchivedSeq uint64 `json:"archived_seq"`
}

// MemoryReport is a Config.Memory run: the samples and the slopes fitted
// past the window. Sizes are MiB, slopes KiB per call.
type MemoryReport struct {
	Calls  int     `json:"calls"`
	Window int     `json:"window_calls"`
	Rate   float64 `json:"rate_calls_per_s"`
	// AchievedRate is the calls per second actually recorded (below Rate
	// when the machine could not keep the pace).
	AchievedRate float64 `json:"achieved_calls_per_s"`
	// Retention is the serve retention the run used: Window / Rate.
	Retention string         `json:"retention"`
	Samples   []MemorySample `json:"samples"`
	// FitFrom is the first sample's call count in the fit: the window has
	// been full, and expiring, for a whole window.
	FitFrom        int     `json:"fit_from_calls"`
	RSSSlopeKB     float64 `json:"rss_slope_kb_per_call"`
	HeldSlopeKB    float64 `json:"rss_held_slope_kb_per_call"`
	HeapSlopeKB    float64 `json:"heap_slope_kb_per_call"`
	EntriesPerCall float64 `json:"entries_per_call"`
	// ProfileDir holds a heap profile per sample (Config.MemProfile).
	ProfileDir string `json:"heap_profiles,omitempty"`
}

// memoryRetention is the serve retention that holds about window calls
// recorded at rate calls per second, in whole seconds (Nats-TTL's unit).
func memoryRetention(window int, rate float64) time.Duration {
	return time.Duration(max(1, math.Ceil(float64(window)/rate))) * time.Second
}

// measureMemory records cfg.Memory calls at cfg.Rate against a serve whose
// retention holds cfg.Window of them, samples the memory every twentieth of
// the run and fits the slope on the samples taken once the window has
// been full for a whole window.
func measureMemory(ctx context.Context, e *env, tools *toolWorkload, cfg Config) (*MemoryReport, error) {
	calls, window, rate := cfg.Memory, cfg.Window, cfg.Rate
	rep := &MemoryReport{Calls: calls, Window: window, Rate: rate, Retention: memoryRetention(window, rate).String(), FitFrom: 2 * window, ProfileDir: cfg.MemProfile}
	if cfg.MemProfile != "" {
		if err := os.MkdirAll(cfg.MemProfile, 0o755); err != nil {
			return nil, fmt.Errorf("--memprofile: %w", err)
		}
	}
	every := max(calls/20, 1)
	// About a second of calls at a time, so the pace is kept closely.
	chunk := min(max(int(rate), 100), 5000)
	start := time.Now()
	sample := func(done int) error {
		s, err := e.sampleMemory(ctx, done, time.Since(start))
		if err != nil {
			return err
		}
		rep.Samples = append(rep.Samples, s)
		fmt.Fprintf(cfg.Progress, "bench --memory: %d calls in %s: RSS %.0f MB, held %.0f MB, Go heap live %.0f MB, Go runtime %.0f MB, stream %d entries (%.0f calls), %d subjects, archived to %d\n",
			done, time.Since(start).Round(time.Second), s.RSSMB, s.HeldMB, s.HeapMB, s.GoMB, s.StreamEntries, s.StreamCalls, s.StreamSubjects, s.ArchivedSeq)
		if cfg.MemProfile != "" {
			if err := writeHeapProfile(filepath.Join(cfg.MemProfile, fmt.Sprintf("heap-%07d.prof", done))); err != nil {
				return fmt.Errorf("--memprofile: %w", err)
			}
		}
		return nil
	}
	if err := sample(0); err != nil {
		return nil, err
	}
	start = time.Now()
	next := every
	for done := 0; done < calls; {
		n := min(calls-done, chunk, next-done)
		if err := recordCalls(ctx, tools, n); err != nil {
			return nil, err
		}
		done += n
		if done == next || done == calls {
			if err := sample(done); err != nil {
				return nil, err
			}
			next += every
		}
		// The pace: done calls are due at start + done/rate; behind it, go
		// on at once.
		due := start.Add(time.Duration(float64(done) / rate * float64(time.Second)))
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
	}
	last := rep.Samples[len(rep.Samples)-1]
	rep.AchievedRate = float64(calls) / last.ElapsedS
	if s, err := e.js.Stream(ctx, stream.DefaultName); err == nil {
		rep.EntriesPerCall = float64(s.CachedInfo().State.LastSeq) / float64(calls)
	}
	rep.RSSSlopeKB, rep.HeldSlopeKB, rep.HeapSlopeKB = memorySlopes(rep.Samples, rep.FitFrom)
	return rep, nil
}

// memorySlopes fits RSS as found, RSS held and live heap against calls by
// least squares over the samples from fitFrom calls on, in KiB per call; 0
// with fewer than two such samples (Config.Validate asks for enough calls
// to have them).
func memorySlopes(samples []MemorySample, fitFrom int) (rss, held, heap float64) {
	var xs, rs, ds, hs []float64
	for _, s := range samples {
		if s.Calls >= fitFrom {
			xs = append(xs, float64(s.Calls))
			rs, ds, hs = append(rs, s.RSSMB), append(ds, s.HeldMB), append(hs, s.HeapMB)
		}
	}
	return slope(xs, rs) * 1024, slope(xs, ds) * 1024, slope(xs, hs) * 1024
}

// slope is the least-squares slope of ys against xs; 0 with fewer than
// two distinct xs (JSON has no NaN).
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	d := n*sxx - sx*sx
	if len(xs) < 2 || d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

// recordCalls records n calls (dispatch and result card, then the report)
// with 128 in flight: --rebuild and --memory record their history with it.
func recordCalls(ctx context.Context, tools *toolWorkload, n int) error {
	if err := tools.prepare(ctx, n, 128); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1)
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
		return fmt.Errorf("record calls: %w", err)
	default:
		return nil
	}
}

// sampleMemory reads the RSS as it is, then collects, returns free pages
// to the system and reads the RSS again and the live heap, then the ledger
// stream's state and the archive's sealed sequence.
func (e *env) sampleMemory(ctx context.Context, done int, elapsed time.Duration) (MemorySample, error) {
	rss, _ := residentMB()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	held, _ := residentMB()
	s := MemorySample{Calls: done, ElapsedS: elapsed.Seconds(), RSSMB: rss, HeldMB: held, HeapMB: float64(ms.HeapAlloc) / (1 << 20),
		GoMB: float64(ms.Sys-ms.HeapReleased) / (1 << 20)}
	st, err := e.js.Stream(ctx, stream.DefaultName)
	if err != nil {
		return s, fmt.Errorf("ledger stream info: %w", err)
	}
	state := st.CachedInfo().State
	s.StreamEntries, s.StreamSubjects = state.Msgs, state.NumSubjects
	if done > 0 {
		s.StreamCalls = float64(state.Msgs) / (float64(state.LastSeq) / float64(done))
	}
	s.ArchivedSeq = e.archivedSeq()
	return s, nil
}

// archivedSeq is /readyz's archived_seq, 0 when it is not there.
func (e *env) archivedSeq() uint64 {
	resp, err := http.Get(e.httpURL + "/readyz")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var body struct {
		ArchivedSeq uint64 `json:"archived_seq"`
	}
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &body)
	return body.ArchivedSeq
}

// WriteText writes the samples and the slopes as `cgledger bench --memory`
// prints them.
func (m MemoryReport) WriteText(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "cgledger bench --memory: %d calls at %.0f calls/s (achieved %.0f), window %d calls (retention %s), %.2f entries per call\n\n",
		m.Calls, m.Rate, m.AchievedRate, m.Window, m.Retention, m.EntriesPerCall); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "%9s %8s %8s %8s %8s %8s %12s %12s %12s %12s\n", "calls", "s", "RSS MB", "held MB", "heap MB", "go MB", "stream ent", "stream calls", "subjects", "archived"); err != nil {
		return err
	}
	for _, s := range m.Samples {
		if _, err := fmt.Fprintf(w, "%9d %8.0f %8.0f %8.0f %8.0f %8.0f %12d %12.0f %12d %12d\n", s.Calls, s.ElapsedS, s.RSSMB, s.HeldMB, s.HeapMB, s.GoMB, s.StreamEntries, s.StreamCalls, s.StreamSubjects, s.ArchivedSeq); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "\nslope from %d calls on (least squares), KB per call: RSS as found %.3f, RSS held (after returning free pages) %.3f, Go heap live %.3f\n", m.FitFrom, m.RSSSlopeKB, m.HeldSlopeKB, m.HeapSlopeKB)
	return err
}
