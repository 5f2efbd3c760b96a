package bench

import (
	"fmt"
	"math"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// heldSample is n entries of every shape heldEntries must keep: no header
// map, an empty one, keys with several values and none, empty and large
// data.
func heldSample(n int) []protocol.Entry {
	out := make([]protocol.Entry, n)
	for i := range out {
		e := protocol.Entry{Seq: uint64(i + 1), Subject: fmt.Sprintf("cg.p.call.%d", i), Time: time.Unix(1_700_000_000, int64(i)*7919)}
		switch i % 5 {
		case 0:
		case 1:
			e.Headers = map[string][]string{}
		case 2:
			e.Headers = map[string][]string{"Nats-Msg-Id": {fmt.Sprint(i)}, "Cg-Link": {"a", "b", ""}, "Empty": {}}
			e.Data = []byte(strings.Repeat("x", 300+i%7))
		case 3:
			e.Headers = map[string][]string{"K": {"v"}}
			e.Data = []byte(strings.Repeat("y", 200))
		case 4:
			e.Data = []byte{byte(i)}
		}
		out[i] = e
	}
	return out
}

func heldOf(entries []protocol.Entry, chunk int) *heldEntries {
	h := newHeldEntries(len(entries))
	h.chunkSize = chunk
	for _, e := range entries {
		h.add(e)
	}
	return h
}

func TestHeldEntriesDecodeToWhatWasAdded(t *testing.T) {
	want := heldSample(50)
	// A chunk smaller than most entries: each of those gets its own.
	h := heldOf(want, 64)
	require.Equal(t, len(want), h.len())
	require.Greater(t, len(h.chunks), 10)
	for i, w := range want {
		got, err := h.decode(i)
		require.NoError(t, err)
		require.True(t, w.Time.Equal(got.Time), "entry %d: time %v, want %v", i, got.Time, w.Time)
		got.Time, w.Time = time.Time{}, time.Time{}
		require.Equal(t, w, got, "entry %d", i)
	}
}

func TestHeldEntryDataCannotBeAppendedIntoTheNext(t *testing.T) {
	h := heldOf(heldSample(10), heldChunkSize)
	require.Len(t, h.chunks, 1)
	e, err := h.decode(3)
	require.NoError(t, err)
	_ = append(e.Data, "zzzz"...)
	next, err := h.decode(4)
	require.NoError(t, err)
	require.Equal(t, []byte{4}, next.Data)
	require.Equal(t, "cg.p.call.4", next.Subject)
}

func TestHeldEntriesEachCoversItsRangeInOrder(t *testing.T) {
	entries := heldSample(2*heldBatch + 10)
	h := heldOf(entries, heldChunkSize)
	var seqs []uint64
	calls := 0
	err := h.each(5, len(entries), func(batch []protocol.Entry) error {
		calls++
		require.LessOrEqual(t, len(batch), heldBatch)
		for _, e := range batch {
			seqs = append(seqs, e.Seq)
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, calls)
	require.Len(t, seqs, len(entries)-5)
	for i, s := range seqs {
		require.Equal(t, uint64(i+6), s)
	}
	require.NoError(t, h.each(7, 7, func([]protocol.Entry) error { t.Fatal("called for an empty range"); return nil }))
	stop := fmt.Errorf("stop")
	require.ErrorIs(t, h.each(0, len(entries), func([]protocol.Entry) error { return stop }), stop)
}

func TestHeldEntriesRefuseATruncatedChunk(t *testing.T) {
	h := heldOf(heldSample(3), heldChunkSize)
	h.chunks[0] = h.chunks[0][:len(h.chunks[0])-1]
	_, err := h.decode(2)
	require.ErrorIs(t, err, errHeldCorrupt)
}

func TestExemptFromMemoryLimitRaisesItAndPutsItBack(t *testing.T) {
	old := debug.SetMemoryLimit(1 << 40)
	defer debug.SetMemoryLimit(old)
	restore := exemptFromMemoryLimit(1 << 30)
	require.Equal(t, int64(1<<40+1<<30), debug.SetMemoryLimit(-1))
	restore()
	require.Equal(t, int64(1<<40), debug.SetMemoryLimit(-1))

	debug.SetMemoryLimit(math.MaxInt64)
	exemptFromMemoryLimit(1 << 30)()
	require.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "no limit stays no limit")
}

// BenchmarkHeldEntriesDecode is what holding the floors' entries encoded
// adds to a floor, per entry.
func BenchmarkHeldEntriesDecode(b *testing.B) {
	h := heldOf(heldSample(heldBatch), heldChunkSize)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		_ = h.each(0, h.len(), func([]protocol.Entry) error { return nil })
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*h.len()), "ns/entry")
}
