// Package toollabels holds the bounded set of tool labels every metric
// with a tool label uses (the ledger's, the executor's, the views' tool
// gauges and serve's consumer gauges) and the latency buckets of every
// cgledger histogram, so the packages that count agree without importing
// one another.
package toollabels

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cgledger/cgledger/protocol"
)

// Other is the value of the tool label of every metric for a tool
// name that is neither registered (in any project) nor built in: the names
// workers dispatch to are theirs to choose, and /metrics is open, so such a
// name never becomes a label of its own.
const Other = "_other"

// Labels decides the tool label of every metric that has one (the
// ledger's, the executor's, the tool gauges and serve's consumer gauges): a name is its own label
// only when it is known, that is registered in some project or built in
// (echo, sleep, the PMO built-ins), and Other otherwise. So the
// series of a tool family number at most the known names plus one, and no
// name a worker made up reaches the open /metrics. A metric about one call
// labels it with CallLabel instead, which also needs the name registered in
// the call's own project (or built in). Label is a lookup in an immutable
// snapshot, cheap enough for every call; Add copies it.
type Labels struct {
	mu    sync.Mutex // serialises Add
	known atomic.Pointer[map[string]struct{}]
}

// New returns Labels knowing names.
func New(names ...string) *Labels {
	t := &Labels{}
	t.Add(names...)
	return t
}

// Label is name when it is known, else Other.
func (t *Labels) Label(name string) string {
	if t.Known(name) {
		return name
	}
	return Other
}

// Names lists the known tool names, sorted: every tool label but
// Other (the views emit their per-tool gauges for each).
func (t *Labels) Names() []string {
	m := t.known.Load()
	if m == nil {
		return nil
	}
	names := make([]string, 0, len(*m))
	for n := range *m {
		if !strings.Contains(n, "\x00") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// Known reports whether name is its own label.
func (t *Labels) Known(name string) bool {
	return !strings.Contains(name, "\x00") && t.has(name)
}

func (t *Labels) has(name string) bool {
	m := t.known.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[name]
	return ok
}

// VersionLabel is the tool_version label of a call of tool name at
// version: "" when the definition has no version, the version when it is a
// version registered (or built in) for that name, else Other. So
// a tool's series number at most its known versions plus two.
func (t *Labels) VersionLabel(name, version string) string {
	if version == "" {
		return ""
	}
	if t.Known(name) && t.has(versionKey(name, version)) {
		return version
	}
	return Other
}

// AddVersion makes version a known version of tool name (and name a known
// tool). A version that is not semver is ignored: no definition has one.
func (t *Labels) AddVersion(name, version string) {
	if version == "" || !protocol.ValidIdentifier(name) {
		return
	}
	var vs protocol.Violations
	protocol.CheckSemver(&vs, "version", version)
	if len(vs) > 0 {
		return
	}
	t.add([]string{name, versionKey(name, version)}, true)
}

// versionKey is how a known version is kept among the known names: the
// NUL keeps it apart from every identifier.
func versionKey(name, version string) string { return name + "\x00" + version }

// builtinKey is how a built-in name is kept among the known names (the
// NUL keeps it apart from every identifier and version key).
func builtinKey(name string) string { return "\x00builtin\x00" + name }

// AddBuiltin makes names known as built-ins: tools served in every project
// without a registration (echo, sleep, the PMO built-ins), whose name is
// the tool label of a call in any project (CallLabel).
func (t *Labels) AddBuiltin(names ...string) {
	keys := make([]string, 0, 2*len(names))
	for _, n := range names {
		if protocol.ValidIdentifier(n) {
			keys = append(keys, n, builtinKey(n))
		}
	}
	t.add(keys, true)
}

// Builtin reports whether name is a built-in's (AddBuiltin).
func (t *Labels) Builtin(name string) bool {
	return t.Known(name) && t.has(builtinKey(name))
}

// CallLabel is the tool label of one call of tool name: the name when it is
// registered in the call's own project (registered: the ledger pinned its
// definition at dispatch, CallRecord.ToolDefSeq) or built in, else
// Other. A name registered only in another project is not the
// call's: an admin of one project dispatching to another project's tool
// name would otherwise count as that tool's traffic (and page for it).
func (t *Labels) CallLabel(name string, registered bool) string {
	if registered && protocol.ValidIdentifier(name) && name != Other {
		t.Add(name)
		return name
	}
	if t.Builtin(name) {
		return name
	}
	return Other
}

// Add makes names known. Names that are not protocol identifiers are
// ignored: no registered or built-in tool has one.
func (t *Labels) Add(names ...string) { t.add(names, false) }

func (t *Labels) add(names []string, versions bool) {
	var fresh []string
	if m := t.known.Load(); m != nil {
		for _, n := range names {
			if _, ok := (*m)[n]; !ok {
				fresh = append(fresh, n)
			}
		}
	} else {
		fresh = names
	}
	if len(fresh) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	next := map[string]struct{}{}
	if m := t.known.Load(); m != nil {
		for n := range *m {
			next[n] = struct{}{}
		}
	}
	for _, n := range fresh {
		if (protocol.ValidIdentifier(n) || versions && strings.Contains(n, "\x00")) && n != Other {
			next[n] = struct{}{}
		}
	}
	t.known.Store(&next)
}

// LatencyBuckets are the histogram buckets of every cgledger latency from a
// millisecond (an API request) to ten minutes (a long tool call); the
// ledger, the executor and serve use them, so dashboards compare like with
// like.
var LatencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
