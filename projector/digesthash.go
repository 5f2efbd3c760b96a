package projector

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
)

// rowHasher feeds the digest's byte stream (docs/views.md: for each row,
// the 8-byte big-endian length of the key, the key, the 8-byte length of
// the value, the value) to SHA-256 on a goroutine of its own. Walking the
// store and hashing each take about half of a digest's time, and a
// restore checks a snapshot by recomputing it (docs/views.md#snapshots):
// on two cores the pipeline makes that check take the longer of the two
// instead of their sum. The bytes hashed, and so the digest, are those of
// one sequential SHA-256.
type rowHasher struct {
	cur  []byte
	full chan []byte
	free chan []byte
	sum  chan []byte
}

// rowHasherChunk is how many bytes are handed to the hashing goroutine at
// a time: large enough that handing over costs nothing next to hashing,
// small enough that the chunks in flight stay in cache.
const rowHasherChunk = 128 << 10

// rowHasherChunks is how many chunks circulate: one filled by the walk,
// the rest hashed or queued, so neither side waits on the other's jitter.
const rowHasherChunks = 4

func newRowHasher() *rowHasher {
	r := &rowHasher{
		cur:  make([]byte, 0, rowHasherChunk),
		full: make(chan []byte, rowHasherChunks),
		free: make(chan []byte, rowHasherChunks),
		sum:  make(chan []byte, 1),
	}
	for range rowHasherChunks - 1 {
		r.free <- make([]byte, 0, rowHasherChunk)
	}
	go r.hash(sha256.New())
	return r
}

func (r *rowHasher) hash(h hash.Hash) {
	for b := range r.full {
		h.Write(b)
		r.free <- b[:0]
	}
	r.sum <- h.Sum(nil)
}

// row appends one row to the stream. A row longer than a chunk goes in a
// chunk of its own size.
func (r *rowHasher) row(k, v []byte) {
	if n := 16 + len(k) + len(v); len(r.cur)+n > cap(r.cur) && len(r.cur) > 0 {
		r.full <- r.cur
		r.cur = <-r.free
	}
	r.cur = binary.BigEndian.AppendUint64(r.cur, uint64(len(k)))
	r.cur = append(r.cur, k...)
	r.cur = binary.BigEndian.AppendUint64(r.cur, uint64(len(v)))
	r.cur = append(r.cur, v...)
}

// finish hands over the last chunk and returns the SHA-256 of the stream.
// It must be called once, also when the walk failed, so the goroutine ends.
func (r *rowHasher) finish() []byte {
	if len(r.cur) > 0 {
		r.full <- r.cur
	}
	close(r.full)
	return <-r.sum
}
