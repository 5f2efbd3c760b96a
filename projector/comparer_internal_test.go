package projector

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"
)

// TestSplitKeepsPebblesProperties checks splitViewKey against the rules
// Pebble states for a Split (base.Split) over keys of every row shape,
// including sequences whose bytes are 0x00, and the shortened keys Pebble
// makes for index blocks (Separator, Successor).
func TestSplitKeepsPebblesProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ids := []string{"a", "ab", "b", "t1", "t10", "t2", "z"}
	id := func() string { return ids[rng.IntN(len(ids))] }
	seq := func() uint64 {
		switch rng.IntN(3) {
		case 0:
			return uint64(rng.IntN(3)) // 0x00 bytes throughout
		case 1:
			return uint64(rng.IntN(300))
		}
		return rng.Uint64()
	}
	var keys [][]byte
	for range 200 {
		var k keyBuf
		switch rng.IntN(8) {
		case 0:
			k = key(tagTimeline, id(), id(), id()).u64(seq())
		case 1:
			k = key(tagTimeline, id(), id(), "").u64(seq())
		case 2:
			k = key(tagStory, id(), id(), id())
		case 3:
			k = key(tagState, id(), id(), id()).u64(seq())
		case 4:
			k = key(tagCard, id(), id()).u64(seq())
		case 5:
			k = key(tagTime).u64(seq()).u64(seq())
		case 6:
			k = key(tagTurnCard, id(), id()).u64(seq())
		default:
			k = key(tagEntry).u64(seq())
		}
		keys = append(keys, k)
	}
	// Index-block separators and successors are keys Pebble splits too.
	c := viewsComparer
	for i, n := 1, len(keys); i < n; i++ {
		a, b := keys[i-1], keys[i]
		if bytes.Compare(a, b) > 0 {
			a, b = b, a
		}
		if bytes.Compare(a, b) < 0 {
			keys = append(keys, c.Separator(nil, a, b))
		}
		keys = append(keys, c.Successor(nil, a))
	}
	prefix := func(k []byte) []byte { return k[:c.Split(k)] }
	for _, a := range keys {
		n := c.Split(a)
		require.LessOrEqual(t, n, len(a))
		if n < len(a) {
			require.Negative(t, bytes.Compare(prefix(a), a), "a prefix sorts before its keys: %q", a)
			require.Equal(t, n, c.Split(prefix(a)), "a prefix is its own prefix: %q", a)
		}
		for _, b := range keys {
			kc, pc := bytes.Compare(a, b), bytes.Compare(prefix(a), prefix(b))
			if kc <= 0 && pc > 0 {
				t.Fatalf("prefix order breaks key order: %q <= %q", a, b)
			}
			if pc < 0 && kc >= 0 {
				t.Fatalf("key order breaks prefix order: %q, %q", a, b)
			}
			if pc == 0 && kc != bytes.Compare(a[c.Split(a):], b[c.Split(b):]) {
				t.Fatalf("suffixes do not order keys of one prefix: %q, %q", a, b)
			}
		}
	}
	require.Equal(t, "tl\x00p\x00t1", string(prefix(key(tagTimeline, "p", "t1", "c").u64(0))))
	require.Equal(t, "st\x00p\x00t1\x00c", string(prefix(key(tagState, "p", "t1", "c").u64(0))))
	require.Equal(t, len(key(tagEntry).u64(0)), c.Split(key(tagEntry).u64(0)), "other rows split as Pebble's default does")
	require.Equal(t, pebble.DefaultComparer.Compare([]byte("a"), []byte("b")), c.Compare([]byte("a"), []byte("b")))
}
