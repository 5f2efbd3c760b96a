package protocol

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/nats-io/nats.go"
)

// Link is one link of the ledger's hash chain (docs/tamper-evidence.md):
// SHA-256 over the previous link, the entry's sequence, subject, chained
// headers in canonical order, and data.
type Link [sha256.Size]byte

// Genesis is the link before sequence 1.
var Genesis Link

// String renders the link in lower-case hex.
func (l Link) String() string { return hex.EncodeToString(l[:]) }

// ParseLink parses a hex link.
func ParseLink(s string) (Link, error) {
	var l Link
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(l) {
		return l, fmt.Errorf("invalid chain link %q: want %d hex bytes", Clip(s), len(l))
	}
	copy(l[:], b)
	return l, nil
}

// ChainedHeaders returns the headers of h the chain covers (nil if none).
func ChainedHeaders(h map[string][]string) map[string][]string {
	var out map[string][]string
	for k, v := range h {
		if IsChainedHeader(k) {
			if out == nil {
				out = make(map[string][]string, len(h))
			}
			out[k] = v
		}
	}
	return out
}

// IsChainedHeader reports whether the chain covers the header named name (in
// any case): every CG-* header (identity, routing, entry kind, time) and the
// W3C trace headers.
// JetStream's own Nats-* headers are not: they steer the server, they are not
// part of what happened.
func IsChainedHeader(name string) bool {
	if len(name) >= 3 && (name[0] == 'C' || name[0] == 'c') && (name[1] == 'G' || name[1] == 'g') && name[2] == '-' {
		return true
	}
	return strings.EqualFold(name, "traceparent") || strings.EqualFold(name, "tracestate")
}

// NextLink computes the link of entry seq from the previous link.
//
// Everything but the data is framed into one buffer on the stack and hashed
// in one write: the projector and every verifier compute a link per entry,
// and per-header writes through hash.Hash (each a conversion that escapes)
// and sort.Slice's reflection were most of its cost.
func NextLink(prev Link, seq uint64, subject string, h nats.Header, data []byte) Link {
	var frameBuf [1024]byte
	b := append(frameBuf[:0], prev[:]...)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint64(b, uint64(len(subject)))
	b = append(b, subject...)
	// Names are hashed lower-cased, ordered by that and then by the
	// original spelling. The lower-cased names live in one arena on the
	// stack; each name holds its place there as offsets, since a slice
	// into the arena kept in names would move the arena to the heap.
	type hv struct {
		start, end int
		orig       string
	}
	var namesBuf [16]hv
	var arenaBuf [512]byte
	names, arena := namesBuf[:0], arenaBuf[:0]
	for k := range h {
		if IsChainedHeader(k) {
			start := len(arena)
			arena = appendLowerASCII(arena, k)
			names = append(names, hv{start, len(arena), k})
		}
	}
	slices.SortFunc(names, func(x, y hv) int {
		if c := bytes.Compare(arena[x.start:x.end], arena[y.start:y.end]); c != 0 {
			return c
		}
		return strings.Compare(x.orig, y.orig)
	})
	b = binary.BigEndian.AppendUint64(b, uint64(len(names)))
	for _, k := range names {
		b = binary.BigEndian.AppendUint64(b, uint64(k.end-k.start))
		b = append(b, arena[k.start:k.end]...)
		vals := h[k.orig]
		b = binary.BigEndian.AppendUint64(b, uint64(len(vals)))
		for _, v := range vals {
			b = binary.BigEndian.AppendUint64(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(data)))
	sum := sha256.New()
	sum.Write(b)
	sum.Write(data)
	var l Link
	sum.Sum(l[:0])
	return l
}

// appendLowerASCII appends lowerASCII(s) to b, without allocating for the
// usual ASCII names.
func appendLowerASCII(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return append(b, lowerASCII(s)...)
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

// lowerASCII lower-cases header names without allocating when they are
// already lower case.
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// ChainVerifier recomputes the chain entry by entry and remembers the first
// sequence that does not match a reference link (or breaks the sequence).
type ChainVerifier struct {
	head     Link
	next     uint64
	count    uint64
	firstBad uint64
	reason   string
}

// NewChainVerifier starts verifying at sequence from, whose previous link is prev.
func NewChainVerifier(from uint64, prev Link) *ChainVerifier {
	return &ChainVerifier{head: prev, next: from}
}

// Add folds one entry into the chain. want, when non-nil, is the reference
// link recorded for seq (in an export file or in the views). It returns false
// once any entry has failed.
func (v *ChainVerifier) Add(seq uint64, subject string, h nats.Header, data []byte, want *Link) bool {
	if v.firstBad != 0 {
		return false
	}
	if seq != v.next {
		v.firstBad, v.reason = v.next, fmt.Sprintf("sequence %d missing (next entry is %d)", v.next, seq)
		return false
	}
	v.head = NextLink(v.head, seq, subject, h, data)
	v.next++
	v.count++
	if want != nil && *want != v.head {
		v.firstBad, v.reason = seq, fmt.Sprintf("entry %d does not match its recorded link (recorded %s, recomputed %s)", seq, want, v.head)
		return false
	}
	return true
}

// Next is the sequence the verifier expects next: one past the last entry
// added, or the first sequence it was started at.
func (v *ChainVerifier) Next() uint64 { return v.next }

// Head is the link of the last entry added.
func (v *ChainVerifier) Head() Link { return v.head }

// Count is the number of entries verified.
func (v *ChainVerifier) Count() uint64 { return v.count }

// FirstBad is the first sequence that failed, or 0; Reason says why.
func (v *ChainVerifier) FirstBad() (uint64, string) { return v.firstBad, v.reason }

// CanonicalHeaders returns h with the names of chained headers (CG-* and
// trace headers) in one spelling: the ledger's own for the headers it knows,
// lower case for other CG-* headers. The chain hashes header names case-
// insensitively, so everything that reads an entry's meaning (the views)
// must read them the same way: two entries with the same chain link then
// always mean the same thing. Values of names that collide are kept in the
// order of the original names, sorted. Other headers are returned as they
// are. h itself is not modified.
func CanonicalHeaders(h map[string][]string) map[string][]string {
	clean := true
	for k := range h {
		if IsChainedHeader(k) && canonicalChained(k) != k {
			clean = false
			break
		}
	}
	if clean {
		return h
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(map[string][]string, len(h))
	for _, k := range keys {
		name := k
		if IsChainedHeader(k) {
			name = canonicalChained(k)
		}
		out[name] = append(out[name], h[k]...)
	}
	return out
}

func canonicalChained(k string) string {
	if c := canonicalHeader(k); c != k || isKnownHeader(k) {
		return c
	}
	return lowerASCII(k)
}

func isKnownHeader(k string) bool {
	for _, n := range knownHeaders {
		if n == k {
			return true
		}
	}
	return false
}
