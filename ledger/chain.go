package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
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
		return l, fmt.Errorf("invalid chain link %q: want %d hex bytes", clip(s), len(l))
	}
	copy(l[:], b)
	return l, nil
}

// ChainedHeaders returns the headers of h the chain covers (nil if none).
func ChainedHeaders(h map[string][]string) map[string][]string {
	var out map[string][]string
	for k, v := range h {
		if chainedHeader(k) {
			if out == nil {
				out = make(map[string][]string, len(h))
			}
			out[k] = v
		}
	}
	return out
}

// chainedHeader reports whether a header is covered by the chain: every
// CG-* header (identity, routing, entry kind, time) and the W3C trace headers.
// JetStream's own Nats-* headers are not: they steer the server, they are not
// part of what happened.
func chainedHeader(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "cg-") || n == "traceparent" || n == "tracestate"
}

// NextLink computes the link of entry seq from the previous link.
func NextLink(prev Link, seq uint64, subject string, h nats.Header, data []byte) Link {
	sum := sha256.New()
	var n [8]byte
	put := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		sum.Write(n[:])
		sum.Write(b)
	}
	sum.Write(prev[:])
	binary.BigEndian.PutUint64(n[:], seq)
	sum.Write(n[:])
	put([]byte(subject))
	type kv struct{ name, orig string }
	var names []kv
	for k := range h {
		if chainedHeader(k) {
			names = append(names, kv{strings.ToLower(k), k})
		}
	}
	sort.Slice(names, func(i, j int) bool {
		if names[i].name != names[j].name {
			return names[i].name < names[j].name
		}
		return names[i].orig < names[j].orig
	})
	binary.BigEndian.PutUint64(n[:], uint64(len(names)))
	sum.Write(n[:])
	for _, k := range names {
		put([]byte(k.name))
		vals := h[k.orig]
		binary.BigEndian.PutUint64(n[:], uint64(len(vals)))
		sum.Write(n[:])
		for _, v := range vals {
			put([]byte(v))
		}
	}
	put(data)
	var l Link
	sum.Sum(l[:0])
	return l
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

// Head is the link of the last entry added.
func (v *ChainVerifier) Head() Link { return v.head }

// Count is the number of entries verified.
func (v *ChainVerifier) Count() uint64 { return v.count }

// FirstBad is the first sequence that failed, or 0; Reason says why.
func (v *ChainVerifier) FirstBad() (uint64, string) { return v.firstBad, v.reason }
