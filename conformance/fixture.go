// Package conformance drives a running tool service, in any language,
// through the protocol's golden and error cases and judges what it did from
// the ledger (docs/conformance.md). It speaks the wire protocol only, with
// an admin credential of the project: dispatches, cancels and pauses as any
// admin may, conformance.command for the commands no dispatch publishes, and
// conformance.observe to see the entries the service caused and its
// consumer's acknowledgements.
package conformance

import (
	"encoding/json"
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/cgledger/cgledger/internal/yamlread"

	"github.com/cgledger/cgledger/protocol"
)

// Fixture is the tool author's description of the tool under test: which
// arguments make it produce what, and what it is (docs/conformance.md,
// "The fixture").
type Fixture struct {
	// Tool is the tool target (the first token after cmd.tool.).
	Tool string `yaml:"tool"`
	// ToolName is content.tool_name of the calls; empty means Tool.
	ToolName string `yaml:"tool_name"`
	// Channel is the channel of the calls; empty means "conformance".
	Channel string `yaml:"channel"`
	// Determinism is pure, idempotent or side_effectful; empty means the
	// registered definition's, else pure.
	Determinism string `yaml:"determinism"`
	// TimeoutMS is the budget of each call (timeout_ms of its command);
	// 0 means 10000.
	TimeoutMS int64 `yaml:"timeout_ms"`
	// Normal is a call that succeeds (or ends with Normal.Status).
	Normal Call `yaml:"normal"`
	// Statuses are, per status (success, failed, canceled, timeout,
	// partial), a call that makes the tool produce it.
	Statuses map[string]Call `yaml:"statuses"`
	// Long, when set, is a call that runs DurationMS and succeeds: the
	// cases about running calls (heartbeats, deadline, a copy of the
	// command while it runs) need one.
	Long *LongCall `yaml:"long"`
}

// Call is a call of the fixture: its arguments and the status expected.
type Call struct {
	Args   map[string]any `yaml:"args"`
	Status string         `yaml:"status"`
	// TimeoutMS overrides Fixture.TimeoutMS for this call.
	TimeoutMS int64 `yaml:"timeout_ms"`
}

// LongCall is a call that takes DurationMS to succeed.
type LongCall struct {
	Args       map[string]any `yaml:"args"`
	DurationMS int64          `yaml:"duration_ms"`
}

var statuses = []string{protocol.StatusSuccess, protocol.StatusFailed, protocol.StatusCanceled, protocol.StatusTimeout, protocol.StatusPartial}

// ParseFixture reads a fixture (YAML or JSON) and fills its defaults; tool
// is the --tool given, which the fixture's tool must equal when it names
// one. Every problem is listed.
func ParseFixture(data []byte, tool string) (Fixture, error) {
	var f Fixture
	var vs protocol.Violations
	// Read leniently, member by member: an unknown member or a value of the
	// wrong type is a violation listed with every other problem, not an
	// error that hides them.
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		vs.Add("fixture", protocol.VInvalidValue, "is not YAML or JSON: %v", err)
		return f, protocol.NewError(protocol.CodeBadRequest, vs, "invalid fixture: %d violation(s)", len(vs))
	}
	if len(doc.Content) > 0 {
		yamlread.Decode(doc.Content[0], &f, "fixture", yamlread.Options{Tag: "yaml", Root: "fixture", Noun: "member"}, &vs)
	}
	// A member already named for its type is not named again for the zero
	// value it was left with.
	named := map[string]bool{}
	for _, v := range vs {
		named[v.Field] = true
	}
	switch {
	case f.Tool == "":
		f.Tool = tool
	case tool != "" && f.Tool != tool:
		vs.Add("fixture.tool", protocol.VMismatch, "the fixture is for tool %q, not %q", f.Tool, tool)
	}
	if !protocol.ValidIdentifier(f.Tool) {
		vs.Add("fixture.tool", protocol.VInvalidToken, "the tool target %q is not an identifier", f.Tool)
	}
	if f.ToolName == "" {
		f.ToolName = f.Tool
	}
	if f.Channel == "" {
		f.Channel = "conformance"
	}
	if !protocol.ValidIdentifier(f.Channel) {
		vs.Add("fixture.channel", protocol.VInvalidToken, "%q is not an identifier", f.Channel)
	}
	switch f.Determinism {
	case "", protocol.DeterminismPure, protocol.DeterminismIdempotent, protocol.DeterminismSideEffectful:
	default:
		vs.Add("fixture.determinism", protocol.VInvalidValue, "must be pure, idempotent or side_effectful, got %q", f.Determinism)
	}
	if f.TimeoutMS == 0 {
		f.TimeoutMS = 10_000
	}
	if (f.TimeoutMS < 0 || f.TimeoutMS > 86_400_000) && !named["fixture.timeout_ms"] {
		vs.Add("fixture.timeout_ms", protocol.VInvalidValue, "must be 1 to 86400000")
	}
	if f.Normal.Args == nil {
		f.Normal.Args = map[string]any{}
	}
	if f.Normal.Status == "" {
		f.Normal.Status = protocol.StatusSuccess
	}
	if !slices.Contains(statuses, f.Normal.Status) {
		vs.Add("fixture.normal.status", protocol.VInvalidValue, "must be one of %v, got %q", statuses, f.Normal.Status)
	}
	for s, c := range f.Statuses {
		if !slices.Contains(statuses, s) {
			vs.Add("fixture.statuses."+s, protocol.VInvalidValue, "is not a status (%v)", statuses)
		}
		if c.Status != "" && c.Status != s {
			vs.Add("fixture.statuses."+s+".status", protocol.VMismatch, "is %q under status %q", c.Status, s)
		}
		c.Status = s
		if c.Args == nil {
			c.Args = map[string]any{}
		}
		f.Statuses[s] = c
	}
	if f.Long != nil {
		switch {
		case named["fixture.long.duration_ms"]:
		case f.Long.DurationMS < 0:
			vs.Add("fixture.long.duration_ms", protocol.VInvalidValue, "must be a positive number of milliseconds, got %d", f.Long.DurationMS)
		case f.Long.DurationMS == 0:
			vs.Add("fixture.long.duration_ms", protocol.VRequired, "is required: how long the long call runs (ms)")
		}
		if f.Long.Args == nil {
			f.Long.Args = map[string]any{}
		}
	}
	if len(vs) > 0 {
		return f, protocol.NewError(protocol.CodeBadRequest, vs, "invalid fixture: %d violation(s)", len(vs))
	}
	return f, nil
}

// argsJSON encodes a call's arguments.
func argsJSON(a map[string]any) (json.RawMessage, error) {
	b, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("fixture arguments: %w", err)
	}
	return b, nil
}
