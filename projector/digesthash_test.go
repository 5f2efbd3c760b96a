package projector

import (
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The pipelined hasher must hash exactly the bytes of one sequential
// SHA-256 over the rows, whatever their sizes against the chunk (empty
// rows, rows that fill a chunk exactly, rows larger than a chunk).
func TestRowHasherEqualsOneSequentialSHA256(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 7, rowHasherChunk - 16, rowHasherChunk, 3 * rowHasherChunk, 100}
	for n := range 2000 {
		sizes = append(sizes, rnd.IntN(4096)+n%3)
	}
	h := newRowHasher()
	want := sha256.New()
	var hdr [8]byte
	for i, size := range sizes {
		k := make([]byte, i%40)
		v := make([]byte, size)
		for j := range k {
			k[j] = byte(rnd.Uint32())
		}
		for j := range v {
			v[j] = byte(rnd.Uint32())
		}
		h.row(k, v)
		binary.BigEndian.PutUint64(hdr[:], uint64(len(k)))
		want.Write(hdr[:])
		want.Write(k)
		binary.BigEndian.PutUint64(hdr[:], uint64(len(v)))
		want.Write(hdr[:])
		want.Write(v)
	}
	require.Equal(t, want.Sum(nil), h.finish())
	require.Equal(t, sha256.New().Sum(nil), newRowHasher().finish(), "no rows: the hash of nothing")
}
