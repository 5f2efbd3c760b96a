// Package pipehash is a SHA-256 that hashes on a goroutine of its own, so
// that producing the bytes and hashing them run on two cores: a snapshot
// restore's per-file check spends about as long reading and writing its
// bytes as hashing them.
package pipehash

import (
	"crypto/sha256"
	"hash"
)

// chunk is how many bytes are handed to the hashing goroutine at a time:
// large enough that handing over costs nothing next to hashing, small
// enough that the chunks in flight stay in cache.
const chunk = 128 << 10

// chunks is how many chunks circulate: one being filled, the rest hashed
// or queued, so neither side waits on the other's jitter.
const chunks = 4

// Hash is a pipelined SHA-256. Its bytes, and so its sum, are those of one
// sequential SHA-256 over everything written. Sum must be called once,
// also when the producer failed, so the goroutine ends; a Hash is not
// usable after it. A Hash is not safe for concurrent writers.
type Hash struct {
	cur  []byte
	full chan []byte
	free chan []byte
	sum  chan []byte
}

// New starts a Hash.
func New() *Hash {
	h := &Hash{
		cur:  make([]byte, 0, chunk),
		full: make(chan []byte, chunks),
		free: make(chan []byte, chunks),
		sum:  make(chan []byte, 1),
	}
	for range chunks - 1 {
		h.free <- make([]byte, 0, chunk)
	}
	go h.run(sha256.New())
	return h
}

func (h *Hash) run(s hash.Hash) {
	for b := range h.full {
		s.Write(b)
		h.free <- b[:0]
	}
	h.sum <- s.Sum(nil)
}

// Write copies p into the stream; it never fails (io.Writer's signature).
func (h *Hash) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if len(h.cur) == cap(h.cur) {
			h.full <- h.cur
			h.cur = <-h.free
		}
		c := copy(h.cur[len(h.cur):cap(h.cur)], p)
		h.cur = h.cur[:len(h.cur)+c]
		p = p[c:]
	}
	return n, nil
}

// Sum hands over what is left and returns the SHA-256 of every byte
// written.
func (h *Hash) Sum() []byte {
	if len(h.cur) > 0 {
		h.full <- h.cur
	}
	close(h.full)
	return <-h.sum
}
