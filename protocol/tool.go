package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// ReservedToolNames are the PMO built-ins a registered tool may not use,
// neither as its tool_name nor as its target: the commands of each are on
// cg.<ver>.<project>.<channel>.cmd.sys.pmo.internal.<name>, and a tool
// credential for the name serves them (docs/security.md).
var ReservedToolNames = []string{"delegate_async", "launch_principal", "ask_expert", "fork_join", "provision_agent"}

// VReserved is the violation code of a name that belongs to a PMO built-in.
const VReserved = "reserved"

// IsPMOTool reports whether name is a PMO built-in tool.
func IsPMOTool(name string) bool {
	for _, r := range ReservedToolNames {
		if name == r {
			return true
		}
	}
	return false
}

// Determinism classes (seed 004): what retrying a tool may do.
const (
	DeterminismPure          = "pure"
	DeterminismIdempotent    = "idempotent"
	DeterminismSideEffectful = "side_effectful"
)

// Tool definition defaults, applied when a field is zero.
const (
	DefaultTimeoutMS      = 30_000
	DefaultTimeoutMSMax   = 300_000
	DefaultConcurrencyMax = 16
	DefaultMaxAttempts    = 3
	DefaultRetryBaseMS    = 200
	DefaultRetryCapMS     = 2_000
)

// ToolLimits are a tool's per-call limits (seed 004 manifest).
type ToolLimits struct {
	TimeoutMSDefault int64 `json:"timeout_ms_default"`
	TimeoutMSMax     int64 `json:"timeout_ms_max"`
	ConcurrencyMax   int   `json:"concurrency_max"`
}

// RetryPolicy is how an executor retries retryable failures: exponential
// backoff from BaseMS, capped at CapMS, with full jitter, at most
// MaxAttempts attempts in all, always within the call's deadline.
type RetryPolicy struct {
	MaxAttempts int   `json:"max_attempts"`
	BaseMS      int64 `json:"base_ms"`
	CapMS       int64 `json:"cap_ms"`
}

// ToolDefinition is a resource.tools entry: what a worker needs to call a
// tool and what an executor needs to run it.
type ToolDefinition struct {
	ProjectID      string          `json:"project_id"`
	ToolName       string          `json:"tool_name"`
	Description    string          `json:"description"`
	Parameters     json.RawMessage `json:"parameters"`
	TargetSubject  string          `json:"target_subject"`
	AfterExecution string          `json:"after_execution"`
	Options        json.RawMessage `json:"options,omitempty"`
	Limits         ToolLimits      `json:"limits"`
	Determinism    string          `json:"determinism"`
	Retry          RetryPolicy     `json:"retry"`
	// SLO is the tool's service level objective (seed 004); nil when the
	// definition sets none (the alerts then assume docs/operations.md's
	// default).
	SLO *ToolSLO `json:"slo,omitempty"`
	// Version is the definition's semantic version (semver 2.0.0, no
	// leading "v"); empty in definitions that declare none. The definition
	// in force at dispatch is pinned in the call record whatever its
	// version (CallRecord.ToolDefSeq).
	Version string `json:"version,omitempty"`
	// Owner names who answers for the tool (a team, a person, an
	// address): free text, shown to operators; empty when not set.
	Owner string `json:"owner,omitempty"`
	// ResultSchema is a JSON Schema (2020-12 unless it names another) the
	// executor holds a successful result to: a result that does not match
	// ends the call failed with CodeResultContract. Absent: not checked.
	ResultSchema json.RawMessage `json:"result_schema,omitempty"`
	// Health is how the ledger tells the tool is served; nil when the
	// definition sets none.
	Health *ToolHealth `json:"health,omitempty"`
	// Approval holds calls for an approver's decision (docs/approvals.md);
	// nil when the definition sets none.
	Approval *ToolApproval `json:"approval,omitempty"`
}

// ToolHealth is a tool's health settings (seed 004).
type ToolHealth struct {
	// FailFastAfterMS: when no tool service has pulled the tool's
	// commands for this long, a dispatch is answered at once with a failed
	// result coded CodeToolUnavailable instead of waiting out its
	// deadline. Zero is not set (dispatch always publishes).
	FailFastAfterMS int64 `json:"fail_fast_after_ms,omitempty"`
}

// Taxonomy codes (seed 004 section 5) of the manifest fields checked
// outside the tool itself.
const (
	// CodeResultContract: a tool's result does not match its
	// result_schema; error.detail.violations lists every mismatch.
	CodeResultContract = "C-CONTRACT-RESULT"
	// CodeToolUnavailable: no tool service pulled the tool's commands
	// within its health.fail_fast_after_ms, so the call was not waited on.
	CodeToolUnavailable = "S-TOOL-UNAVAILABLE"
)

// LedgerSourceID is the author_id and CG-Source-Id of the results the
// ledger records itself (a call answered CodeToolUnavailable).
const LedgerSourceID = "cgledger.ledger"

// ToolSLO is a tool's service level objective: the share of calls that
// must resolve success, and the 95th percentile latency calls must stay
// under. A zero field is not set.
type ToolSLO struct {
	SuccessRateMin  float64 `json:"success_rate_min,omitempty"`
	P95LatencyMSMax int64   `json:"p95_latency_ms_max,omitempty"`
}

// ToolOptions is the part of options the executor interprets.
type ToolOptions struct {
	Args struct {
		Defaults map[string]json.RawMessage `json:"defaults,omitempty"`
		Fixed    map[string]json.RawMessage `json:"fixed,omitempty"`
	} `json:"args"`
	Envs map[string]string `json:"envs,omitempty"`
}

// ParsedOptions decodes the definition's options.
func (d *ToolDefinition) ParsedOptions() (ToolOptions, error) {
	var o ToolOptions
	if len(d.Options) == 0 {
		return o, nil
	}
	if err := json.Unmarshal(d.Options, &o); err != nil {
		return o, fmt.Errorf("tool %s: decode options: %w", d.ToolName, err)
	}
	return o, nil
}

// TargetFor expands the target subject's {project_id} and {channel_id}.
func (d *ToolDefinition) TargetFor(project, channel string) string {
	return strings.NewReplacer("{project_id}", project, "{channel_id}", channel).Replace(d.TargetSubject)
}

// CompileSchema compiles the definition's parameters as a JSON Schema
// (draft 2020-12 unless the schema names another with $schema).
func (d *ToolDefinition) CompileSchema() (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(d.Parameters))
	if err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	// Schemas must be self-contained: never fetch remote $refs.
	c.UseLoader(noLoader{})
	const loc = "urn:cgledger:tool-parameters"
	if err := c.AddResource(loc, doc); err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	return c.Compile(loc)
}

// CompileResultSchema compiles the definition's result_schema (nil, nil
// when it has none), as CompileSchema does its parameters.
func (d *ToolDefinition) CompileResultSchema() (*jsonschema.Schema, error) {
	if len(d.ResultSchema) == 0 {
		return nil, nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(d.ResultSchema))
	if err != nil {
		return nil, fmt.Errorf("result_schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	const loc = "urn:cgledger:tool-result"
	if err := c.AddResource(loc, doc); err != nil {
		return nil, fmt.Errorf("result_schema: %w", err)
	}
	return c.Compile(loc)
}

type noLoader struct{}

// Load refuses every remote reference.
func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("remote $ref %q is not allowed: tool schemas must be self-contained", url)
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidEnvName reports whether s can name an environment variable: a letter
// or underscore, then letters, digits and underscores.
func ValidEnvName(s string) bool { return envNameRE.MatchString(s) }

// ParseToolYAML parses a tool definition from YAML (JSON is YAML too) for
// project, validates it, and fills defaults. It returns every violation at
// once as a bad_request *Error.
func ParseToolYAML(project string, data []byte) (*ToolDefinition, error) {
	var vs Violations
	if len(data) > MaxRequestBytes {
		vs.Add("body", VTooLarge, "is %d bytes; the limit is %d", len(data), MaxRequestBytes)
		return nil, BadRequest("tool definition", vs)
	}
	// Checked here rather than left to the YAML decoder so that the
	// violation is the same as for every other request body.
	if !utf8.Valid(data) {
		vs.Add("body", VInvalidUTF8, "is not valid UTF-8")
		return nil, BadRequest("tool definition", vs)
	}
	// JSON is YAML, but YAML's duplicate-key error does not name the path;
	// a JSON body gets the same duplicate-key violations as other requests.
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(trimmed) {
		CheckDuplicateKeys("tool", trimmed, &vs)
		if err := BadRequest("tool definition", vs); err != nil {
			return nil, err
		}
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		vs.Add("body", VInvalidValue, "is not valid YAML or JSON: %v", err)
		return nil, BadRequest("tool definition", vs)
	}
	j, err := json.Marshal(yamlToJSON(doc))
	if err != nil {
		vs.Add("body", VInvalidValue, "cannot be represented as JSON: %v", err)
		return nil, BadRequest("tool definition", vs)
	}
	return ParseToolJSON(project, j)
}

// yamlToJSON turns YAML's decoded values into JSON-encodable ones.
func yamlToJSON(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = yamlToJSON(x)
		}
		return t
	case map[any]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			m[fmt.Sprint(k)] = yamlToJSON(x)
		}
		return m
	case []any:
		for i, x := range t {
			t[i] = yamlToJSON(x)
		}
		return t
	}
	return v
}

// ParseToolJSON is ParseToolYAML for JSON.
func ParseToolJSON(project string, data []byte) (*ToolDefinition, error) {
	var vs Violations
	o, ok := ParseObject("tool", data, &vs)
	if !ok {
		return nil, BadRequest("tool definition", vs)
	}
	if utf8.ValidString(project) {
		CheckIdent(&vs, "project_id", project, true)
	} else {
		vs.Add("project_id", VInvalidUTF8, "the %s header is not valid UTF-8", HeaderProjectID)
	}
	// The same precedence as every request naming a project (checkCaller
	// in package ledger): another project, named by a valid identifier,
	// is forbidden and nothing else is reported; a value that is not an
	// identifier names no project and is a bad_request with the rest.
	if p := o.Str("project_id", false); p != "" && p != project {
		if ValidIdentifier(p) && ValidIdentifier(project) {
			var fs Violations
			fs.Add(o.Path("project_id"), VForbidden, "project %q is not the project the tool is registered in (%q)", Clip(p), project)
			return nil, NewError(CodeForbidden, fs, "tool definition names another project")
		}
		vs.Add(o.Path("project_id"), VInvalidToken, "must be the project the tool is registered in (%q), got %q", project, Clip(p))
	}
	d := &ToolDefinition{ProjectID: project}
	d.ToolName = o.Ident("tool_name", true)
	if IsPMOTool(d.ToolName) {
		vs.Add(o.Path("tool_name"), VReserved, "%q is a PMO built-in tool name and cannot be registered", d.ToolName)
	}
	d.Description = o.Str("description", false)
	if p := o.Raw("parameters"); p == nil {
		vs.Add(o.Path("parameters"), VRequired, "is required (a JSON Schema object)")
	} else if p[0] != '{' {
		vs.Add(o.Path("parameters"), VInvalidType, "must be a JSON Schema object")
	} else {
		d.Parameters = CompactJSON(p)
		var root struct {
			Type any `json:"type"`
		}
		_ = json.Unmarshal(p, &root)
		if root.Type != "object" {
			vs.Add(o.Path("parameters.type"), VInvalidValue, `must be "object": tool arguments are a JSON object`)
		}
		if _, err := d.CompileSchema(); err != nil {
			vs.Add(o.Path("parameters"), "invalid_schema", "is not a valid JSON Schema (2020-12): %v", err)
		}
	}
	d.TargetSubject = o.Str("target_subject", true)
	if d.TargetSubject != "" {
		checkTarget(&vs, o.Path("target_subject"), project, d.TargetSubject)
	}
	d.AfterExecution = o.Str("after_execution", true)
	if d.AfterExecution != "" && !ValidAfterExecution(d.AfterExecution) {
		vs.Add(o.Path("after_execution"), VInvalidValue, "must be %q or %q, got %q", AfterSuspend, AfterTerminate, Clip(d.AfterExecution))
	}
	if opts := o.Raw("options"); opts != nil {
		if opts[0] != '{' {
			vs.Add(o.Path("options"), VInvalidType, "must be an object")
		} else {
			d.Options = CompactJSON(opts)
			checkOptions(&vs, o.Path("options"), opts)
		}
	}
	if lo, ok := o.Object("limits", false); ok {
		d.Limits.TimeoutMSDefault = intField(lo, "timeout_ms_default", 1, 24*3600*1000)
		d.Limits.TimeoutMSMax = intField(lo, "timeout_ms_max", 1, 24*3600*1000)
		d.Limits.ConcurrencyMax = int(intField(lo, "concurrency_max", 1, 10_000))
	}
	d.Determinism = o.Str("determinism", false)
	switch d.Determinism {
	case "", DeterminismPure, DeterminismIdempotent, DeterminismSideEffectful:
	default:
		vs.Add(o.Path("determinism"), VInvalidValue, "must be pure, idempotent or side_effectful, got %q", Clip(d.Determinism))
	}
	if ro, ok := o.Object("retry", false); ok {
		d.Retry.MaxAttempts = int(intField(ro, "max_attempts", 1, 10))
		d.Retry.BaseMS = intField(ro, "base_ms", 1, 60_000)
		d.Retry.CapMS = intField(ro, "cap_ms", 1, 600_000)
	}
	if so, ok := o.Object("slo", false); ok {
		slo := &ToolSLO{P95LatencyMSMax: intField(so, "p95_latency_ms_max", 1, 24*3600*1000)}
		if r := so.Raw("success_rate_min"); r != nil {
			if err := json.Unmarshal(r, &slo.SuccessRateMin); err != nil {
				vs.Add(so.Path("success_rate_min"), VInvalidType, "must be a number")
			} else if slo.SuccessRateMin <= 0 || slo.SuccessRateMin >= 1 {
				vs.Add(so.Path("success_rate_min"), VInvalidValue, "must be above 0 and below 1 (0.995 is 99.5%%), got %v", slo.SuccessRateMin)
				slo.SuccessRateMin = 0
			}
		}
		if slo.SuccessRateMin != 0 || slo.P95LatencyMSMax != 0 {
			d.SLO = slo
		}
	}
	if ao, ok := o.Object("approval", false); ok {
		d.Approval = parseToolApproval(ao, &vs)
	}
	if v := o.Str("version", false); v != "" {
		CheckSemver(&vs, o.Path("version"), v)
		d.Version = v
	}
	d.Owner = o.Str("owner", false)
	if len(d.Owner) > maxOwnerBytes {
		vs.Add(o.Path("owner"), VTooLarge, "is %d bytes; the limit is %d", len(d.Owner), maxOwnerBytes)
	}
	if r := o.Raw("result_schema"); r != nil {
		if r[0] != '{' {
			vs.Add(o.Path("result_schema"), VInvalidType, "must be a JSON Schema object")
		} else {
			d.ResultSchema = CompactJSON(r)
			if _, err := d.CompileResultSchema(); err != nil {
				schemaViolations(&vs, o.Path("result_schema"), err)
			}
		}
	}
	if ho, ok := o.Object("health", false); ok {
		if ms := intField(ho, "fail_fast_after_ms", 1, 24*3600*1000); ms != 0 {
			d.Health = &ToolHealth{FailFastAfterMS: ms}
		}
	}
	d.fillDefaults()
	if d.Limits.TimeoutMSMax < d.Limits.TimeoutMSDefault {
		vs.Add("tool.limits.timeout_ms_max", VInvalidValue, "must be at least timeout_ms_default (%d), got %d", d.Limits.TimeoutMSDefault, d.Limits.TimeoutMSMax)
	}
	if d.Retry.CapMS < d.Retry.BaseMS {
		vs.Add("tool.retry.cap_ms", VInvalidValue, "must be at least base_ms (%d), got %d", d.Retry.BaseMS, d.Retry.CapMS)
	}
	if err := BadRequest("tool definition", vs); err != nil {
		return nil, err
	}
	return d, nil
}

// WithDefaults returns a copy of d with every zero limit, retry field and
// determinism set to its default, as ParseToolJSON sets them: a definition
// built in Go leaves them zero, which ParseToolJSON would refuse.
func (d *ToolDefinition) WithDefaults() *ToolDefinition {
	c := *d
	c.fillDefaults()
	return &c
}

func (d *ToolDefinition) fillDefaults() {
	if d.Limits.TimeoutMSDefault == 0 {
		d.Limits.TimeoutMSDefault = DefaultTimeoutMS
	}
	if d.Limits.TimeoutMSMax == 0 {
		d.Limits.TimeoutMSMax = max(DefaultTimeoutMSMax, d.Limits.TimeoutMSDefault)
	}
	if d.Limits.ConcurrencyMax == 0 {
		d.Limits.ConcurrencyMax = DefaultConcurrencyMax
	}
	if d.Determinism == "" {
		d.Determinism = DeterminismSideEffectful
	}
	if d.Retry.MaxAttempts == 0 {
		d.Retry.MaxAttempts = DefaultMaxAttempts
	}
	if d.Retry.BaseMS == 0 {
		d.Retry.BaseMS = DefaultRetryBaseMS
	}
	if d.Retry.CapMS == 0 {
		d.Retry.CapMS = max(DefaultRetryCapMS, d.Retry.BaseMS)
	}
}

// intField reads an integer field within [lo, hi]; 0 when absent.
func intField(o JSONObject, name string, lo, hi int64) int64 {
	r := o.Raw(name)
	if r == nil {
		return 0
	}
	var n int64
	if err := json.Unmarshal(r, &n); err != nil {
		o.vs.Add(o.Path(name), VInvalidType, "must be an integer")
		return 0
	}
	if n < lo || n > hi {
		o.vs.Add(o.Path(name), VInvalidValue, "must be between %d and %d, got %d", lo, hi, n)
		return 0
	}
	return n
}

// checkTarget validates a target subject: a cmd.tool subject of this
// project, with {project_id} and {channel_id} the only placeholders.
func checkTarget(vs *Violations, field, project, target string) {
	// An invalid project is a violation of its own; probe with a valid
	// stand-in so the target's own problems are still all found.
	probeProject := project
	if !ValidIdentifier(project) {
		probeProject = "project"
	}
	probe := strings.NewReplacer("{project_id}", probeProject, "{channel_id}", "channel").Replace(target)
	if strings.ContainsAny(probe, "{}") {
		vs.Add(field, VInvalidValue, "only {project_id} and {channel_id} may be used as placeholders")
		return
	}
	toks := strings.Split(probe, ".")
	if len(toks) >= 6 && toks[4] == "cmd" && toks[5] == "sys" {
		vs.Add(field, VForbidden, "must be a cmd.tool.* subject: cmd.sys.* belongs to PMO built-ins")
		return
	}
	sub, err := ParseSubject(probe)
	if err != nil || sub.Kind != SubjectToolCommand {
		vs.Add(field, VInvalidSubject, "must look like cg.<ver>.{project_id}.{channel_id}.cmd.tool.<target>[...], got %q", Clip(target))
		return
	}
	if sub.Project != probeProject && ValidIdentifier(project) {
		vs.Add(field, VMismatch, "names project %q; use {project_id} or %q", sub.Project, project)
	}
	// A target is the actor of its tool's credential, consumer and reports:
	// a PMO built-in's name there would make a registered tool's credential
	// and that built-in's one and the same.
	if len(sub.Target) > 0 && IsPMOTool(sub.Target[0]) {
		vs.Add(field, VReserved, "target %q is a PMO built-in tool name (served on cmd.sys.pmo.internal.%s)", sub.Target[0], sub.Target[0])
	}
}

func checkOptions(vs *Violations, field string, raw json.RawMessage) {
	var o struct {
		Args *struct {
			Defaults json.RawMessage `json:"defaults"`
			Fixed    json.RawMessage `json:"fixed"`
		} `json:"args"`
		Envs json.RawMessage `json:"envs"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		vs.Add(field, VInvalidType, "malformed options: %v", err)
		return
	}
	isObj := func(r json.RawMessage) bool { return len(r) == 0 || isNull(r) || r[0] == '{' }
	if o.Args != nil {
		if !isObj(o.Args.Defaults) {
			vs.Add(field+".args.defaults", VInvalidType, "must be an object (parameter -> value)")
		}
		if !isObj(o.Args.Fixed) {
			vs.Add(field+".args.fixed", VInvalidType, "must be an object (parameter -> value)")
		}
	}
	if len(o.Envs) > 0 && !isNull(o.Envs) {
		var envs map[string]string
		if err := json.Unmarshal(o.Envs, &envs); err != nil {
			vs.Add(field+".envs", VInvalidType, "must map parameter names to environment variable names (strings)")
		} else {
			keys := make([]string, 0, len(envs))
			for k := range envs {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if !envNameRE.MatchString(envs[k]) {
					vs.Add(field+".envs."+k, VInvalidValue, "must be an environment variable name, got %q", Clip(envs[k]))
				}
			}
		}
	}
	checkVendorOptions(vs, field, raw)
}

// ToolSubject builds cg.<ver>.<project>.tool.<tool_name>.
func ToolSubject(version, project, tool string) string {
	return Subject{Kind: SubjectTool, Version: version, Project: project, Tool: tool}.String()
}

// RegisterResult is the outcome of a tool registration.
type RegisterResult struct {
	ToolName string `json:"tool_name"`
	// Seq is the ledger sequence of the definition now in force.
	Seq uint64 `json:"seq"`
	// Unchanged is true when the same definition was already in force; no
	// entry was written.
	Unchanged  bool           `json:"unchanged"`
	Definition ToolDefinition `json:"definition"`
}

// StoredTool is a definition and the entry that wrote it.
type StoredTool struct {
	Seq        uint64         `json:"seq"`
	Definition ToolDefinition `json:"definition"`
}
