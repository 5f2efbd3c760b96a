package ledger

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// OtherToolLabel is the value of the tool label of every metric for a tool
// name that is neither registered (in any project) nor built in: the names
// workers dispatch to are theirs to choose, and /metrics is open, so such a
// name never becomes a label of its own.
const OtherToolLabel = "_other"

// ToolLabels decides the tool label of every metric that has one (the
// ledger's, the executor's, the tool gauges and serve's consumer gauges): a name is its own label
// only when it is known, that is registered in some project or built in
// (echo, sleep, the PMO built-ins), and OtherToolLabel otherwise. So the
// series of a tool family number at most the known names plus one, and no
// name a worker made up reaches the open /metrics. A metric about one call
// labels it with CallLabel instead, which also needs the name registered in
// the call's own project (or built in). Label is a lookup in an immutable
// snapshot, cheap enough for every call; Add copies it.
type ToolLabels struct {
	mu    sync.Mutex // serialises Add
	known atomic.Pointer[map[string]struct{}]
}

// NewToolLabels returns ToolLabels knowing names.
func NewToolLabels(names ...string) *ToolLabels {
	t := &ToolLabels{}
	t.Add(names...)
	return t
}

// Label is name when it is known, else OtherToolLabel.
func (t *ToolLabels) Label(name string) string {
	if t.Known(name) {
		return name
	}
	return OtherToolLabel
}

// Names lists the known tool names, sorted: every tool label but
// OtherToolLabel (the views emit their per-tool gauges for each).
func (t *ToolLabels) Names() []string {
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
func (t *ToolLabels) Known(name string) bool {
	return !strings.Contains(name, "\x00") && t.has(name)
}

func (t *ToolLabels) has(name string) bool {
	m := t.known.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[name]
	return ok
}

// VersionLabel is the tool_version label of a call of tool name at
// version: "" when the definition has no version, the version when it is a
// version registered (or built in) for that name, else OtherToolLabel. So
// a tool's series number at most its known versions plus two.
func (t *ToolLabels) VersionLabel(name, version string) string {
	if version == "" {
		return ""
	}
	if t.Known(name) && t.has(versionKey(name, version)) {
		return version
	}
	return OtherToolLabel
}

// AddVersion makes version a known version of tool name (and name a known
// tool). A version that is not semver is ignored: no definition has one.
func (t *ToolLabels) AddVersion(name, version string) {
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
func (t *ToolLabels) AddBuiltin(names ...string) {
	keys := make([]string, 0, 2*len(names))
	for _, n := range names {
		if protocol.ValidIdentifier(n) {
			keys = append(keys, n, builtinKey(n))
		}
	}
	t.add(keys, true)
}

// Builtin reports whether name is a built-in's (AddBuiltin).
func (t *ToolLabels) Builtin(name string) bool {
	return t.Known(name) && t.has(builtinKey(name))
}

// CallLabel is the tool label of one call of tool name: the name when it is
// registered in the call's own project (registered: the ledger pinned its
// definition at dispatch, CallRecord.ToolDefSeq) or built in, else
// OtherToolLabel. A name registered only in another project is not the
// call's: an admin of one project dispatching to another project's tool
// name would otherwise count as that tool's traffic (and page for it).
func (t *ToolLabels) CallLabel(name string, registered bool) string {
	if registered && protocol.ValidIdentifier(name) && name != OtherToolLabel {
		t.Add(name)
		return name
	}
	if t.Builtin(name) {
		return name
	}
	return OtherToolLabel
}

// Add makes names known. Names that are not protocol identifiers are
// ignored: no registered or built-in tool has one.
func (t *ToolLabels) Add(names ...string) { t.add(names, false) }

func (t *ToolLabels) add(names []string, versions bool) {
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
		if (protocol.ValidIdentifier(n) || versions && strings.Contains(n, "\x00")) && n != OtherToolLabel {
			next[n] = struct{}{}
		}
	}
	t.known.Store(&next)
}

// newBuiltinLabels returns ToolLabels knowing the PMO built-ins as built-ins.
func newBuiltinLabels() *ToolLabels {
	t := NewToolLabels()
	t.AddBuiltin(protocol.ReservedToolNames...)
	return t
}

// callToolLabel is the tool label of every ledger metric about call rec
// (ToolLabels.CallLabel): its name when the call pinned a definition
// registered in its own project at dispatch or the name is built in, else
// OtherToolLabel.
func (l *Ledger) callToolLabel(rec *protocol.CallRecord) string {
	return l.labels.CallLabel(rec.ToolName, rec.ToolDefSeq != 0)
}

// ToolLabels is the ledger's: it knows the PMO built-ins, every tool
// registered in any project when the ledger opened, and every registration
// this process has made or seen since (the cache watch sees every ledger's
// tool entries). A process that embeds an executor shares it with the
// executor, which adds its built-ins (executor.New).
func (l *Ledger) ToolLabels() *ToolLabels { return l.labels }

// registeredToolNames lists every tool name registered in any project.
func registeredToolNames(ctx context.Context, stream jetstream.Stream, version string) ([]string, error) {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(protocol.Root+"."+version+".*.tool.*"))
	if err != nil {
		return nil, fmt.Errorf("list registered tool names: %w", err)
	}
	names := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		names = append(names, subj[strings.LastIndexByte(subj, '.')+1:])
	}
	return names, nil
}

// toolSubjectName is the tool name of a tool entry's subject
// (cg.<ver>.<project>.tool.<name>), or "" for any other subject.
func toolSubjectName(subject string) string {
	toks := strings.Split(subject, ".")
	if len(toks) != 5 || toks[0] != protocol.Root || toks[3] != "tool" {
		return ""
	}
	return toks[4]
}
