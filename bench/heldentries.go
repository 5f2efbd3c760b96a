package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// heldEntries holds the ledger's entries in memory for the floors of
// --rebuild, encoded one after another into large byte chunks instead of
// as protocol.Entry values; each decodes back to the entry it was made from.
//
// The bench runs serve in its own process, and serve's memory_limit (1 GiB
// by default) and gc_percent are process-wide. Held as []protocol.Entry
// (a header map each), the 5M entries of a 1M-call run were gigabytes of
// pointers over serve's limit: the collector ran without pause through
// every measured row, marking them on each cycle, which no serve does. A
// chunk holds no pointers, so a collection never scans it, and
// exemptFromMemoryLimit leaves its bytes out of serve's limit: the rows are
// measured under serve's own memory settings (docs/decisions.md).
type heldEntries struct {
	chunks [][]byte
	refs   []heldRef
	// chunkSize is the size of a new chunk (an entry larger gets a chunk of
	// its own).
	chunkSize int
}

// heldRef is where an encoded entry starts.
type heldRef struct{ chunk, off uint32 }

// heldChunkSize is the size of a chunk of heldEntries.
const heldChunkSize = 64 << 20

// heldBatch is how many entries heldEntries.each decodes at a time.
const heldBatch = 4096

func newHeldEntries(capacity int) *heldEntries {
	return &heldEntries{refs: make([]heldRef, 0, capacity), chunkSize: heldChunkSize}
}

// len is the number of entries held.
func (h *heldEntries) len() int { return len(h.refs) }

// bytes is the memory the chunks take.
func (h *heldEntries) bytes() int64 {
	var n int64
	for _, c := range h.chunks {
		n += int64(cap(c))
	}
	return n
}

// add appends e. Its layout: sequence, time (Unix ns), subject, the
// header keys each with its values (a count of zero for no header map, else
// keys+1), data; lengths and counts as uvarints.
func (h *heldEntries) add(e protocol.Entry) {
	size := 3*binary.MaxVarintLen64 + len(e.Subject) + len(e.Data) + 2*binary.MaxVarintLen64
	for k, vs := range e.Headers {
		size += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			size += binary.MaxVarintLen64 + len(v)
		}
	}
	if len(h.chunks) == 0 || cap(h.chunks[len(h.chunks)-1])-len(h.chunks[len(h.chunks)-1]) < size {
		h.chunks = append(h.chunks, make([]byte, 0, max(h.chunkSize, size)))
	}
	i := len(h.chunks) - 1
	b := h.chunks[i]
	h.refs = append(h.refs, heldRef{chunk: uint32(i), off: uint32(len(b))})
	b = binary.AppendUvarint(b, e.Seq)
	b = binary.AppendVarint(b, e.Time.UnixNano())
	b = appendBytes(b, e.Subject)
	if e.Headers == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(e.Headers))+1)
		for k, vs := range e.Headers {
			b = appendBytes(b, k)
			b = binary.AppendUvarint(b, uint64(len(vs)))
			for _, v := range vs {
				b = appendBytes(b, v)
			}
		}
	}
	b = appendBytes(b, string(e.Data))
	h.chunks[i] = b
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// errHeldCorrupt is a chunk that does not decode: a bug of add or decode.
var errHeldCorrupt = errors.New("bench: held entry does not decode")

// decode returns entry i: new strings and header map, its data a slice of
// the chunk (capped, so an append cannot write into the next entry). The
// time is made as nats.go makes a message's timestamp.
func (h *heldEntries) decode(i int) (protocol.Entry, error) {
	r := h.refs[i]
	b := h.chunks[r.chunk][r.off:]
	var e protocol.Entry
	var ok bool
	if e.Seq, b, ok = uvarint(b); !ok {
		return e, fmt.Errorf("%w: entry %d: sequence", errHeldCorrupt, i)
	}
	ns, n := binary.Varint(b)
	if n <= 0 {
		return e, fmt.Errorf("%w: entry %d: time", errHeldCorrupt, i)
	}
	e.Time, b = time.Unix(0, ns), b[n:]
	var s []byte
	if s, b, ok = bytesOf(b); !ok {
		return e, fmt.Errorf("%w: entry %d: subject", errHeldCorrupt, i)
	}
	e.Subject = string(s)
	var keys uint64
	if keys, b, ok = uvarint(b); !ok {
		return e, fmt.Errorf("%w: entry %d: headers", errHeldCorrupt, i)
	}
	if keys > 0 {
		e.Headers = make(map[string][]string, keys-1)
		for range keys - 1 {
			var k []byte
			var nv uint64
			if k, b, ok = bytesOf(b); !ok {
				return e, fmt.Errorf("%w: entry %d: header key", errHeldCorrupt, i)
			}
			if nv, b, ok = uvarint(b); !ok || nv > uint64(len(b)) {
				return e, fmt.Errorf("%w: entry %d: header values", errHeldCorrupt, i)
			}
			vs := make([]string, nv)
			for j := range vs {
				var v []byte
				if v, b, ok = bytesOf(b); !ok {
					return e, fmt.Errorf("%w: entry %d: header value", errHeldCorrupt, i)
				}
				vs[j] = string(v)
			}
			e.Headers[string(k)] = vs
		}
	}
	if s, _, ok = bytesOf(b); !ok {
		return e, fmt.Errorf("%w: entry %d: data", errHeldCorrupt, i)
	}
	if len(s) > 0 {
		e.Data = s[:len(s):len(s)]
	}
	return e, nil
}

func uvarint(b []byte) (uint64, []byte, bool) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, nil, false
	}
	return v, b[n:], true
}

func bytesOf(b []byte) ([]byte, []byte, bool) {
	n, b, ok := uvarint(b)
	if !ok || n > uint64(len(b)) {
		return nil, nil, false
	}
	return b[:n], b[n:], true
}

// each calls fn with entries from to to (exclusive), decoded heldBatch at
// a time into one slice it reuses: fn must not keep the slice (the
// entries themselves it may keep). It is safe to call from several
// goroutines at once.
func (h *heldEntries) each(from, to int, fn func([]protocol.Entry) error) error {
	batch := make([]protocol.Entry, 0, min(heldBatch, max(to-from, 0)))
	for i := from; i < to; {
		batch = batch[:0]
		for ; i < to && len(batch) < heldBatch; i++ {
			e, err := h.decode(i)
			if err != nil {
				return err
			}
			batch = append(batch, e)
		}
		if err := fn(batch); err != nil {
			return err
		}
	}
	return nil
}

// exemptFromMemoryLimit raises the process's soft memory limit (serve's
// memory_limit) by extra bytes, those the bench itself holds, and returns
// the function that puts the limit back. Without a limit it does nothing.
func exemptFromMemoryLimit(extra int64) (restore func()) {
	limit := debug.SetMemoryLimit(-1)
	if limit == math.MaxInt64 || extra <= 0 {
		return func() {}
	}
	debug.SetMemoryLimit(limit + min(extra, math.MaxInt64-limit))
	return func() { debug.SetMemoryLimit(limit) }
}
