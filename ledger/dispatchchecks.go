package ledger

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/cgledger/cgledger/protocol"
)

// maxCachedSchemas bounds the compiled parameters schemas the ledger keeps
// for dispatches' checks.arguments.
const maxCachedSchemas = 4096

// argumentsRoot is where a dispatch's checks.arguments violations point:
// the tool.call card's arguments, as the dispatch body holds them.
const argumentsRoot = "card.content.arguments"

// dispatchChecks runs the checks a dispatch asked for (checks.registered,
// checks.arguments) and lists every violation; unknown reports that the
// tool is neither registered nor built in. Checks whose inputs are invalid
// already (a subject without a project, a tool name that is no identifier,
// a card that does not decode) are skipped: those inputs have violations of
// their own.
func (l *Ledger) dispatchChecks(ctx context.Context, checks *protocol.DispatchChecks, sub protocol.Subject, card *protocol.Card, toolName string) (vs protocol.Violations, unknown bool, err error) {
	if !protocol.ValidIdentifier(sub.Project) || !protocol.ValidIdentifier(toolName) {
		return nil, false, nil
	}
	registered, err := l.registeredTool(ctx, sub.Project, toolName)
	if err != nil {
		return nil, false, err
	}
	def, key, seq := l.builtin[toolName], "\x00builtin\x00"+toolName, uint64(0)
	if registered != nil {
		def, key, seq = &registered.Definition, sub.Project+"\x00"+toolName, registered.Seq
	}
	pmo := sub.Kind == protocol.SubjectPMOCommand && slices.Contains(protocol.ReservedToolNames, toolName)
	if checks.Registered && def == nil && !pmo {
		msg := fmt.Sprintf("project %s has no tool %q: neither registered nor built in", sub.Project, toolName)
		if near := l.nearestTools(ctx, sub.Project, toolName); len(near) > 0 {
			msg += "; nearest: " + strings.Join(near, ", ")
		}
		vs.Add("card.content.tool_name", protocol.VNotFound, "%s", msg)
		return vs, true, nil
	}
	if !checks.Arguments || def == nil || card == nil || card.Type != protocol.CardToolCall {
		return vs, false, nil
	}
	return append(vs, l.argumentViolations(card, def, key, seq)...), false, nil
}

// argumentViolations checks the card's arguments against def's parameters
// schema as the executor will check them: with the tool's
// options.args.defaults, options.args.fixed and options.envs applied. Only
// what the caller gave is judged: a violation inside a member those options
// supply is the tool's registration's, which the executor reports as it
// always has (an options.envs value is known only to the executor), and a
// schema or options that do not compile or decode are left to it the same
// way (C-TOOL-CONFIG).
func (l *Ledger) argumentViolations(card *protocol.Card, def *protocol.ToolDefinition, key string, seq uint64) []protocol.Violation {
	tc, err := card.ToolCall()
	if err != nil {
		return nil
	}
	args := map[string]any{}
	if len(tc.Arguments) > 0 {
		v, err := decodeNumbers(tc.Arguments)
		m, isObj := v.(map[string]any)
		if err != nil || !isObj {
			// The card's own violation (card.content.arguments) says so.
			return nil
		}
		args = m
	}
	opts, err := def.ParsedOptions()
	if err != nil {
		return nil
	}
	supplied := map[string]bool{}
	for k, raw := range opts.Args.Defaults {
		if _, given := args[k]; given {
			continue
		}
		if v, err := decodeNumbers(raw); err == nil {
			args[k], supplied[k] = v, true
		}
	}
	for k, raw := range opts.Args.Fixed {
		if v, err := decodeNumbers(raw); err == nil {
			args[k], supplied[k] = v, true
		}
	}
	for param := range opts.Envs {
		args[param], supplied[param] = "", true
	}
	schema, err := l.parametersSchema(def, key, seq)
	if err != nil {
		return nil
	}
	var out []protocol.Violation
	for _, v := range protocol.SchemaViolations(schema, args, argumentsRoot) {
		member, _, _ := strings.Cut(strings.TrimPrefix(v.Field, argumentsRoot+"."), ".")
		if v.Field != argumentsRoot && supplied[member] {
			continue
		}
		out = append(out, v)
	}
	return out
}

// parametersSchema is def's compiled parameters schema, from memory once
// compiled for its version.
func (l *Ledger) parametersSchema(def *protocol.ToolDefinition, key string, seq uint64) (*jsonschema.Schema, error) {
	if s, ok := l.schemas.Get(key, seq); ok {
		return s, nil
	}
	s, err := def.CompileSchema()
	if err != nil {
		return nil, err
	}
	l.schemas.Put(key, seq, s)
	return s, nil
}

// nearestTools names up to three of the project's tools (registered and
// built in) closest to name by edit distance, for a refusal's message; only
// a refusal pays for the listing, and a failure to list names none.
func (l *Ledger) nearestTools(ctx context.Context, project, name string) []string {
	info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(protocol.ToolSubject(l.version, project, "*")))
	if err != nil {
		l.log.Debug("dispatch checks: list tools for a suggestion", "project", project, "err", err)
		return nil
	}
	names := map[string]bool{}
	for subj := range info.State.Subjects {
		names[protocol.ToolEntryName(subj)] = true
	}
	for n := range l.builtin {
		names[n] = true
	}
	type cand struct {
		name string
		d    int
	}
	limit := max(2, len(name)/3)
	var cs []cand
	for n := range names {
		if d := editDistance(name, n); d <= limit || strings.Contains(n, name) || strings.Contains(name, n) {
			cs = append(cs, cand{n, d})
		}
	}
	slices.SortFunc(cs, func(a, b cand) int { return cmp.Or(cmp.Compare(a.d, b.d), cmp.Compare(a.name, b.name)) })
	out := make([]string, 0, 3)
	for _, c := range cs[:min(3, len(cs))] {
		out = append(out, c.name)
	}
	return out
}

// editDistance is the Levenshtein distance of a and b, in bytes (tool names
// are ASCII identifiers).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// decodeNumbers decodes JSON keeping numbers as json.Number, so a large
// integer reaches the schema as written.
func decodeNumbers(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}
