package protocol

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// TestHeadersCleanAgreesWithTheFullWalk: CheckHeaders' allocation-free
// answer for a clean block is given only when the full walk finds nothing,
// and every block the full walk refuses is refused the same way.
func TestHeadersCleanAgreesWithTheFullWalk(t *testing.T) {
	base := func() nats.Header {
		return nats.Header{HeaderAgentID: {"a1"}, HeaderAgentTurnID: {"t1"}, HeaderTurnEpoch: {"1"}, HeaderToolCallID: {"c1"}}
	}
	cases := map[string]func(nats.Header){
		"clean":                   func(nats.Header) {},
		"multi-valued other":      func(h nats.Header) { h["X-Thing"] = []string{"a", "b"} },
		"cg twice":                func(h nats.Header) { h[HeaderAgentID] = []string{"a", "b"} },
		"cg case variant":         func(h nats.Header) { h["cg-agent-id"] = []string{"a1"} },
		"unknown cg case variant": func(h nats.Header) { h["CG-New"], h["cg-new"] = []string{"x"}, []string{"y"} },
		"traceparent variant":     func(h nats.Header) { h["traceparent"], h["Traceparent"] = []string{"x"}, []string{"y"} },
		"other case variant":      func(h nats.Header) { h["X-A"], h["x-a"] = []string{"x"}, []string{"y"} },
		"bad utf8 value":          func(h nats.Header) { h["X-A"] = []string{"\xff"} },
		"bad utf8 name":           func(h nats.Header) { h["X-\xff"] = []string{"v"} },
		"non-ascii name":          func(h nats.Header) { h["CG-İ"], h["cg-i̇"] = []string{"x"}, []string{"y"} },
		"too large":               func(h nats.Header) { h["X-Big"] = []string{strings.Repeat("v", MaxHeaderBytes)} },
	}
	for name, edit := range cases {
		h := base()
		edit(h)
		full, _ := checkHeadersFull(h)
		if headersClean(h) {
			require.Empty(t, full, name)
		}
		got, bad := CheckHeaders(h)
		fullAgain, fullBad := checkHeadersFull(h)
		require.Equal(t, fullAgain, got, name)
		require.Equal(t, len(fullBad), len(bad), name)
	}
	require.True(t, headersClean(base()))
	require.Zero(t, testing.AllocsPerRun(100, func() { _, _ = CheckHeaders(base()) })-testing.AllocsPerRun(100, func() { _ = base() }))
}
