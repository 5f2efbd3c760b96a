package executor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/cgledger/cgledger/protocol"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// templateVars are the only template variables options may use (seed 003).
func templateVars(c *Call, meta protocol.CardMetadata) *strings.Replacer {
	step := c.StepID
	if step == "" {
		step = meta.StepID
	}
	return strings.NewReplacer(
		"{project_id}", c.ProjectID, "{channel_id}", c.ChannelID, "{agent_id}", c.AgentID,
		"{agent_turn_id}", c.AgentTurnID, "{step_id}", step, "{tool_call_id}", c.ToolCallID,
		"{parent_step_id}", meta.ParentStepID, "{trace_id}", meta.TraceID,
		"{turn_epoch}", strconv.FormatUint(c.TurnEpoch, 10), "{context_box_id}", c.ContextBoxID,
	)
}

// expand replaces template variables in every string of v, recursively.
func expand(v any, r *strings.Replacer) any {
	switch t := v.(type) {
	case string:
		return r.Replace(t)
	case map[string]any:
		for k, x := range t {
			t[k] = expand(x, r)
		}
	case []any:
		for i, x := range t {
			t[i] = expand(x, r)
		}
	}
	return v
}

func decodeAny(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// resolveArgs builds the final arguments: the card's arguments, then
// options.args.defaults (only where absent; an explicit null counts as
// given), options.args.fixed (always), template variables in both, then
// options.envs (parameter <- environment variable value). It returns the
// secret values injected, for redaction.
func resolveArgs(c *Call, cardArgs json.RawMessage, opts protocol.ToolOptions, meta protocol.CardMetadata, env func(string) (string, bool)) (map[string]any, []string, *Outcome) {
	args := map[string]any{}
	if len(cardArgs) > 0 {
		v, err := decodeAny(cardArgs)
		m, ok := v.(map[string]any)
		if err != nil || !ok {
			o := Invalid("tool.call arguments are not a JSON object", protocol.Violation{Field: "arguments", Code: protocol.VInvalidType, Message: "must be a JSON object"})
			return nil, nil, &o
		}
		args = m
	}
	r := templateVars(c, meta)
	for _, k := range sortedKeys(opts.Args.Defaults) {
		if _, given := args[k]; given {
			continue
		}
		v, err := decodeAny(opts.Args.Defaults[k])
		if err != nil {
			o := Terminal(CodeToolConfig, fmt.Sprintf("options.args.defaults.%s does not decode", k), "fix the tool registration")
			return nil, nil, &o
		}
		args[k] = expand(v, r)
	}
	for _, k := range sortedKeys(opts.Args.Fixed) {
		v, err := decodeAny(opts.Args.Fixed[k])
		if err != nil {
			o := Terminal(CodeToolConfig, fmt.Sprintf("options.args.fixed.%s does not decode", k), "fix the tool registration")
			return nil, nil, &o
		}
		args[k] = expand(v, r)
	}
	var secrets []string
	envKeys := make([]string, 0, len(opts.Envs))
	for k := range opts.Envs {
		envKeys = append(envKeys, k)
	}
	sort.Strings(envKeys)
	for _, param := range envKeys {
		name := opts.Envs[param]
		val, ok := env(name)
		if !ok || val == "" {
			// Only the variable's name is ever recorded.
			o := Terminal(CodeToolConfig, fmt.Sprintf("environment variable %s (for parameter %s) is not set on the executor", name, param), "set "+name+" in the executor's environment")
			return nil, nil, &o
		}
		args[param] = val
		secrets = append(secrets, val)
	}
	return args, secrets, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// validateArgs checks the final arguments against the tool's schema and
// lists every violation, field by field.
func validateArgs(schema *jsonschema.Schema, args map[string]any) []protocol.Violation {
	return validateValue(schema, args, "arguments")
}

// validateValue checks v against schema and lists every violation, field by
// field under root (protocol.SchemaViolations, which a dispatch's
// checks.arguments shares).
func validateValue(schema *jsonschema.Schema, v any, root string) []protocol.Violation {
	return protocol.SchemaViolations(schema, v, root)
}

// redactor removes secret values from anything the executor writes.
type redactor []string

const redacted = "[REDACTED]"

// bytes replaces every secret, raw and JSON-escaped, in b.
func (r redactor) bytes(b []byte) []byte {
	for _, s := range r {
		if len(s) < 4 {
			continue
		}
		b = bytes.ReplaceAll(b, []byte(s), []byte(redacted))
		if esc, err := json.Marshal(s); err == nil && len(esc) > 2 {
			b = bytes.ReplaceAll(b, esc[1:len(esc)-1], []byte(redacted))
		}
	}
	return b
}

func (r redactor) str(s string) string { return string(r.bytes([]byte(s))) }
