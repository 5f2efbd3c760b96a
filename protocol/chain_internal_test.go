package protocol

import (
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// nextLinkReference is the chain link written the plainest way, as
// docs/tamper-evidence.md defines it: NextLink must give the same bytes.
func nextLinkReference(prev Link, seq uint64, subject string, h nats.Header, data []byte) Link {
	sum := sha256.New()
	var n [8]byte
	putLen := func(l int) {
		binary.BigEndian.PutUint64(n[:], uint64(l))
		sum.Write(n[:])
	}
	sum.Write(prev[:])
	binary.BigEndian.PutUint64(n[:], seq)
	sum.Write(n[:])
	putLen(len(subject))
	sum.Write([]byte(subject))
	type hv struct{ name, orig string }
	var names []hv
	for k := range h {
		if IsChainedHeader(k) {
			names = append(names, hv{lowerASCII(k), k})
		}
	}
	sort.Slice(names, func(i, j int) bool {
		if names[i].name != names[j].name {
			return names[i].name < names[j].name
		}
		return names[i].orig < names[j].orig
	})
	putLen(len(names))
	for _, k := range names {
		putLen(len(k.name))
		sum.Write([]byte(k.name))
		vals := h[k.orig]
		putLen(len(vals))
		for _, v := range vals {
			putLen(len(v))
			sum.Write([]byte(v))
		}
	}
	putLen(len(data))
	sum.Write(data)
	var l Link
	sum.Sum(l[:0])
	return l
}

// TestNextLinkMatchesReference covers names in every case, colliding
// spellings, non-ASCII names, many and long headers (past the stack
// buffers) and headers the chain leaves out.
func TestNextLinkMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	names := []string{"CG-Project-Id", "cg-project-id", "CG-PROJECT-ID", "Cg-Ä-Name", "cg-ä-name", "CG-É", "traceparent", "TraceState",
		"Nats-Msg-Id", "X-Other", "CG-Time", "CG-Entry-Kind", "cg-x"}
	prev := Genesis
	for i := range 3000 {
		h := nats.Header{}
		for range rng.IntN(8) {
			k := names[rng.IntN(len(names))]
			for range 1 + rng.IntN(2) {
				h[k] = append(h[k], string(make([]byte, rng.IntN(300))))
			}
		}
		for j := range rng.IntN(3) * 10 {
			h["CG-Extra-"+string(rune('A'+j))+string(make([]byte, rng.IntN(40)))] = []string{"v"}
		}
		data := make([]byte, rng.IntN(2000))
		for j := range data {
			data[j] = byte(rng.IntN(256))
		}
		subject := "cg.v1.p.c.turn.call.report"
		got := NextLink(prev, uint64(i+1), subject, h, data)
		require.Equal(t, nextLinkReference(prev, uint64(i+1), subject, h, data), got, "headers %v", h)
		prev = got
	}
}
