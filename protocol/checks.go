package protocol

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"sort"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// DispatchChecks is a dispatch body's optional "checks": what the ledger
// checks before it writes anything, refusing (and recording the refusal of)
// a dispatch that fails them, instead of leaving the failure to the tool
// service. Both are off unless asked for, so a dispatch that does not ask
// costs what it always did.
type DispatchChecks struct {
	// Registered refuses a dispatch whose tool is neither registered in
	// the project nor built in (not_found, on card.content.tool_name).
	Registered bool `json:"registered,omitempty"`
	// Arguments refuses a dispatch whose card.content.arguments fail the
	// tool's parameters schema (bad_request, every violation).
	Arguments bool `json:"arguments,omitempty"`
}

// Any reports whether c asks for any check (a nil c asks for none).
func (c *DispatchChecks) Any() bool { return c != nil && (c.Registered || c.Arguments) }

// ParseDispatchChecks reads a dispatch body's optional "checks" object
// ({"registered": bool, "arguments": bool}), listing every violation; nil
// when absent or when it asks for no check (so {} is the same dispatch as
// none).
func ParseDispatchChecks(o JSONObject, vs *Violations) *DispatchChecks {
	co, ok := o.Object("checks", false)
	if !ok {
		return nil
	}
	c := &DispatchChecks{}
	for _, k := range slices.Sorted(maps.Keys(co.fields)) {
		var dst *bool
		switch k {
		case "registered":
			dst = &c.Registered
		case "arguments":
			dst = &c.Arguments
		default:
			vs.Add(co.Path(k), VInvalidValue, "is not a member of checks (only \"registered\" and \"arguments\")")
			continue
		}
		if json.Unmarshal(co.Raw(k), dst) != nil {
			vs.Add(co.Path(k), VInvalidType, "must be true or false")
		}
	}
	if !c.Any() {
		return nil
	}
	return c
}

// SchemaViolations checks v against schema and lists every violation, field
// by field under root (root.a.b for member b of member a): a missing
// required member is its own violation (code required), any other failure
// is coded by its schema keyword (type, minimum, additionalProperties…).
// The executor checks final arguments and results with it, and a dispatch
// its checks.arguments.
func SchemaViolations(schema *jsonschema.Schema, v any, root string) []Violation {
	if schema == nil {
		return nil
	}
	// Round-trip through JSON so numbers and nested values have the types
	// the validator expects.
	b, err := json.Marshal(v)
	if err != nil {
		return []Violation{{Field: root, Code: VInvalidJSON, Message: err.Error()}}
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return []Violation{{Field: root, Code: VInvalidJSON, Message: err.Error()}}
	}
	err = schema.Validate(inst)
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return []Violation{{Field: root, Code: VInvalidValue, Message: err.Error()}}
	}
	var out []Violation
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		field := root
		for _, p := range e.InstanceLocation {
			field += "." + p
		}
		if req, ok := e.ErrorKind.(*kind.Required); ok {
			for _, m := range req.Missing {
				out = append(out, Violation{Field: field + "." + m, Code: VRequired, Message: "is required"})
			}
			return
		}
		code := "schema"
		if kp := e.ErrorKind.KeywordPath(); len(kp) > 0 {
			code = kp[0]
		}
		out = append(out, Violation{Field: field, Code: code, Message: e.ErrorKind.LocalizedString(schemaPrinter)})
	}
	walk(ve)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}
