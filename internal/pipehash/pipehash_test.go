package pipehash

import (
	"crypto/sha256"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The pipelined hash must equal one sequential SHA-256 over the same
// writes, whatever their sizes against the chunk: empty writes, writes
// that fill a chunk exactly, writes that span several chunks.
func TestSumEqualsOneSequentialSHA256(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 7, chunk - 8, chunk, 3*chunk + 5, 8, 100}
	for n := range 3000 {
		sizes = append(sizes, rnd.IntN(4096)+n%3)
	}
	h := New()
	want := sha256.New()
	for _, size := range sizes {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rnd.Uint32())
		}
		n, err := h.Write(b)
		require.NoError(t, err)
		require.Equal(t, size, n)
		want.Write(b)
	}
	require.Equal(t, want.Sum(nil), h.Sum())
	empty := sha256.Sum256(nil)
	require.Equal(t, empty[:], New().Sum(), "nothing written: the hash of nothing")
}
