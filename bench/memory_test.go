package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/violationtest"
)

func TestMemoryConfig(t *testing.T) {
	require.NoError(t, Config{Serve: noServe, Memory: 300, Window: 100, Rate: 50}.Validate())
	err := Config{Serve: noServe, Memory: 200, Window: 100, Rebuild: 5, Retention: "1h", Rate: -1}.Validate()
	require.Equal(t, []string{"Memory", "Retention", "Window", "Rate"}, violationtest.ConfigFields(t, err))
	err = Config{Serve: noServe, Window: 10, Rate: 5}.Validate()
	require.Equal(t, []string{"Window", "Rate"}, violationtest.ConfigFields(t, err), "window and rate only with memory")

	c := Config{Memory: 1000000}.withDefaults()
	require.Equal(t, 100000, c.Window, "a tenth by default")
	require.Equal(t, float64(DefaultMemoryRate), c.Rate)
	require.Equal(t, "1m40s", c.Retention, "the window at the pace")
	require.Equal(t, 3*time.Second, memoryRetention(2001, 1000), "whole seconds, rounded up")
	require.Equal(t, time.Second, memoryRetention(1, 1000), "at least a second")
}

func TestMemorySlopes(t *testing.T) {
	// RSS grows 1 MiB per 1024 calls (1 KiB a call) before 2000 calls and
	// 0.1 KiB a call after; the heap is flat after; held is noisy around
	// 0.5 KiB a call. Only samples from 2000 calls on count.
	var samples []MemorySample
	for calls := 0; calls <= 10000; calls += 1000 {
		s := MemorySample{Calls: calls, RSSMB: float64(calls) / 1024, HeapMB: float64(calls) / 1024}
		if calls >= 2000 {
			s.RSSMB = 2000.0/1024 + 0.1*float64(calls-2000)/1024
			s.HeapMB = 2000.0 / 1024
		}
		s.HeldMB = 0.5 * float64(calls) / 1024
		if calls%2000 == 0 {
			s.HeldMB += 0.25
		} else {
			s.HeldMB -= 0.25
		}
		samples = append(samples, s)
	}
	rss, held, heap := memorySlopes(samples, 2000)
	require.InDelta(t, 0.1, rss, 1e-9)
	require.InDelta(t, 0.0, heap, 1e-9)
	require.InDelta(t, 0.5, held, 0.05)
	rss, _, _ = memorySlopes(samples, 10000)
	require.Zero(t, rss, "one sample fits no slope")
}

func TestMemoryWriteText(t *testing.T) {
	r := Report{Memory: &MemoryReport{Calls: 3000, Window: 1000, Rate: 1000, AchievedRate: 950, Retention: "1s", EntriesPerCall: 5, FitFrom: 2000,
		Samples:    []MemorySample{{Calls: 3000, ElapsedS: 3.2, RSSMB: 900, HeldMB: 400, HeapMB: 200, GoMB: 250, StreamEntries: 5000, StreamCalls: 1000, StreamSubjects: 3000, ArchivedSeq: 14000}},
		RSSSlopeKB: 0.5, HeldSlopeKB: 0.25, HeapSlopeKB: 0.125}}
	var b bytes.Buffer
	require.NoError(t, r.WriteText(&b))
	lines := strings.Split(b.String(), "\n")
	require.Equal(t, "cgledger bench --memory: 3000 calls at 1000 calls/s (achieved 950), window 1000 calls (retention 1s), 5.00 entries per call", lines[0])
	require.Equal(t, "     3000        3      900      400      200      250         5000         1000         3000        14000", lines[3])
	require.Equal(t, "slope from 2000 calls on (least squares), KB per call: RSS as found 0.500, RSS held (after returning free pages) 0.250, Go heap live 0.125", lines[5])
}
