package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// ReservedToolNames are the PMO built-ins a registered tool may not use.
var ReservedToolNames = []string{"delegate_async", "launch_principal", "ask_expert", "fork_join", "provision_agent"}

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
}

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
	Jina *JinaOptions      `json:"jina,omitempty"`
}

// JinaOptions configures the built-in HTTP/OpenAPI tool (seed 003 section 4).
type JinaOptions struct {
	Mode    string `json:"mode"`
	BaseURL string `json:"base_url"`
	Path    string `json:"path,omitempty"`
	Method  string `json:"method,omitempty"`
	AuthEnv string `json:"auth_env,omitempty"`
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

type noLoader struct{}

// Load refuses every remote reference.
func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("remote $ref %q is not allowed: tool schemas must be self-contained", url)
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ParseToolYAML parses a tool definition from YAML (JSON is YAML too) for
// project, validates it, and fills defaults. It returns every violation at
// once as a bad_request *Error.
func ParseToolYAML(project string, data []byte) (*ToolDefinition, error) {
	var vs Violations
	if len(data) > MaxRequestBytes {
		vs.Add("body", VTooLarge, "is %d bytes; the limit is %d", len(data), MaxRequestBytes)
		return nil, badRequest("tool definition", vs)
	}
	// Checked here rather than left to the YAML decoder so that the
	// violation is the same as for every other request body.
	if !utf8.Valid(data) {
		vs.Add("body", VInvalidUTF8, "is not valid UTF-8")
		return nil, badRequest("tool definition", vs)
	}
	// JSON is YAML, but YAML's duplicate-key error does not name the path;
	// a JSON body gets the same duplicate-key violations as other requests.
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(trimmed) {
		checkDuplicateKeys("tool", trimmed, &vs)
		if err := badRequest("tool definition", vs); err != nil {
			return nil, err
		}
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		vs.Add("body", VInvalidValue, "is not valid YAML or JSON: %v", err)
		return nil, badRequest("tool definition", vs)
	}
	j, err := json.Marshal(yamlToJSON(doc))
	if err != nil {
		vs.Add("body", VInvalidValue, "cannot be represented as JSON: %v", err)
		return nil, badRequest("tool definition", vs)
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
	o, ok := parseObject("tool", data, &vs)
	if !ok {
		return nil, badRequest("tool definition", vs)
	}
	if utf8.ValidString(project) {
		checkIdent(&vs, "project_id", project, true)
	} else {
		vs.Add("project_id", VInvalidUTF8, "the %s header is not valid UTF-8", HeaderProjectID)
	}
	if p := o.str("project_id", false); p != "" && p != project {
		vs.Add(o.path("project_id"), VMismatch, "must equal the project the tool is registered in (%q), got %q", project, p)
	}
	d := &ToolDefinition{ProjectID: project}
	d.ToolName = o.ident("tool_name", true)
	for _, r := range ReservedToolNames {
		if d.ToolName == r {
			vs.Add(o.path("tool_name"), "reserved", "%q is a PMO built-in tool name and cannot be registered", r)
		}
	}
	d.Description = o.str("description", false)
	if p := o.raw("parameters"); p == nil {
		vs.Add(o.path("parameters"), VRequired, "is required (a JSON Schema object)")
	} else if p[0] != '{' {
		vs.Add(o.path("parameters"), VInvalidType, "must be a JSON Schema object")
	} else {
		d.Parameters = compactJSON(p)
		var root struct {
			Type any `json:"type"`
		}
		_ = json.Unmarshal(p, &root)
		if root.Type != "object" {
			vs.Add(o.path("parameters.type"), VInvalidValue, `must be "object": tool arguments are a JSON object`)
		}
		if _, err := d.CompileSchema(); err != nil {
			vs.Add(o.path("parameters"), "invalid_schema", "is not a valid JSON Schema (2020-12): %v", err)
		}
	}
	d.TargetSubject = o.str("target_subject", true)
	if d.TargetSubject != "" {
		checkTarget(&vs, o.path("target_subject"), project, d.TargetSubject)
	}
	d.AfterExecution = o.str("after_execution", true)
	if d.AfterExecution != "" && !ValidAfterExecution(d.AfterExecution) {
		vs.Add(o.path("after_execution"), VInvalidValue, "must be %q or %q, got %q", AfterSuspend, AfterTerminate, clip(d.AfterExecution))
	}
	if opts := o.raw("options"); opts != nil {
		if opts[0] != '{' {
			vs.Add(o.path("options"), VInvalidType, "must be an object")
		} else {
			d.Options = compactJSON(opts)
			checkOptions(&vs, o.path("options"), opts)
		}
	}
	if lo, ok := o.object("limits", false); ok {
		d.Limits.TimeoutMSDefault = intField(lo, "timeout_ms_default", 1, 24*3600*1000)
		d.Limits.TimeoutMSMax = intField(lo, "timeout_ms_max", 1, 24*3600*1000)
		d.Limits.ConcurrencyMax = int(intField(lo, "concurrency_max", 1, 10_000))
	}
	d.Determinism = o.str("determinism", false)
	switch d.Determinism {
	case "", DeterminismPure, DeterminismIdempotent, DeterminismSideEffectful:
	default:
		vs.Add(o.path("determinism"), VInvalidValue, "must be pure, idempotent or side_effectful, got %q", clip(d.Determinism))
	}
	if ro, ok := o.object("retry", false); ok {
		d.Retry.MaxAttempts = int(intField(ro, "max_attempts", 1, 10))
		d.Retry.BaseMS = intField(ro, "base_ms", 1, 60_000)
		d.Retry.CapMS = intField(ro, "cap_ms", 1, 600_000)
	}
	if so, ok := o.object("slo", false); ok {
		slo := &ToolSLO{P95LatencyMSMax: intField(so, "p95_latency_ms_max", 1, 24*3600*1000)}
		if r := so.raw("success_rate_min"); r != nil {
			if err := json.Unmarshal(r, &slo.SuccessRateMin); err != nil {
				vs.Add(so.path("success_rate_min"), VInvalidType, "must be a number")
			} else if slo.SuccessRateMin <= 0 || slo.SuccessRateMin >= 1 {
				vs.Add(so.path("success_rate_min"), VInvalidValue, "must be above 0 and below 1 (0.995 is 99.5%%), got %v", slo.SuccessRateMin)
				slo.SuccessRateMin = 0
			}
		}
		if slo.SuccessRateMin != 0 || slo.P95LatencyMSMax != 0 {
			d.SLO = slo
		}
	}
	d.fillDefaults()
	if d.Limits.TimeoutMSMax < d.Limits.TimeoutMSDefault {
		vs.Add("tool.limits.timeout_ms_max", VInvalidValue, "must be at least timeout_ms_default (%d), got %d", d.Limits.TimeoutMSDefault, d.Limits.TimeoutMSMax)
	}
	if d.Retry.CapMS < d.Retry.BaseMS {
		vs.Add("tool.retry.cap_ms", VInvalidValue, "must be at least base_ms (%d), got %d", d.Retry.BaseMS, d.Retry.CapMS)
	}
	if err := badRequest("tool definition", vs); err != nil {
		return nil, err
	}
	return d, nil
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
func intField(o jsonObject, name string, lo, hi int64) int64 {
	r := o.raw(name)
	if r == nil {
		return 0
	}
	var n int64
	if err := json.Unmarshal(r, &n); err != nil {
		o.vs.Add(o.path(name), VInvalidType, "must be an integer")
		return 0
	}
	if n < lo || n > hi {
		o.vs.Add(o.path(name), VInvalidValue, "must be between %d and %d, got %d", lo, hi, n)
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
		vs.Add(field, VInvalidSubject, "must look like cg.<ver>.{project_id}.{channel_id}.cmd.tool.<target>[...], got %q", clip(target))
		return
	}
	if sub.Project != probeProject && ValidIdentifier(project) {
		vs.Add(field, VMismatch, "names project %q; use {project_id} or %q", sub.Project, project)
	}
}

func checkOptions(vs *Violations, field string, raw json.RawMessage) {
	var o struct {
		Args *struct {
			Defaults json.RawMessage `json:"defaults"`
			Fixed    json.RawMessage `json:"fixed"`
		} `json:"args"`
		Envs json.RawMessage `json:"envs"`
		Jina json.RawMessage `json:"jina"`
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
					vs.Add(field+".envs."+k, VInvalidValue, "must be an environment variable name, got %q", clip(envs[k]))
				}
			}
		}
	}
	if len(o.Jina) > 0 && !isNull(o.Jina) {
		var j JinaOptions
		if err := json.Unmarshal(o.Jina, &j); err != nil {
			vs.Add(field+".jina", VInvalidType, "must be an object: %v", err)
			return
		}
		if j.Mode != "search" && j.Mode != "reader" {
			vs.Add(field+".jina.mode", VInvalidValue, `must be "search" or "reader", got %q`, clip(j.Mode))
		}
		if !strings.HasPrefix(j.BaseURL, "https://") && !strings.HasPrefix(j.BaseURL, "http://") {
			vs.Add(field+".jina.base_url", VInvalidValue, "must be an http(s) URL, got %q", clip(j.BaseURL))
		}
		if j.Method != "" && j.Method != "GET" && j.Method != "POST" {
			vs.Add(field+".jina.method", VInvalidValue, "must be GET or POST, got %q", clip(j.Method))
		}
		if j.AuthEnv != "" && !envNameRE.MatchString(j.AuthEnv) {
			vs.Add(field+".jina.auth_env", VInvalidValue, "must be an environment variable name, got %q", clip(j.AuthEnv))
		}
	}
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

// RegisterToolYAML validates and records a tool definition. Registering the
// same definition again writes nothing; a changed one is a new version
// entry. It is readable with GetTool as soon as this returns.
func (l *Ledger) RegisterToolYAML(ctx context.Context, project string, body []byte) (RegisterResult, error) {
	d, err := ParseToolYAML(project, body)
	if err != nil {
		e, _ := AsError(err)
		return RegisterResult{}, l.reject(ctx, OpToolRegister, project, Unrouted, e, rejectedRequest("", nats.Header{HeaderProjectID: {project}}, body))
	}
	data, err := json.Marshal(d)
	if err != nil {
		return RegisterResult{}, fmt.Errorf("register tool: encode: %w", err)
	}
	return l.registerTool(ctx, d, data)
}

// RegisterTool records an already validated definition (see RegisterToolYAML).
func (l *Ledger) RegisterTool(ctx context.Context, d *ToolDefinition) (RegisterResult, error) {
	data, err := json.Marshal(d)
	if err != nil {
		return RegisterResult{}, fmt.Errorf("register tool: encode: %w", err)
	}
	if _, err := ParseToolJSON(d.ProjectID, data); err != nil {
		e, _ := AsError(err)
		return RegisterResult{}, l.reject(ctx, OpToolRegister, d.ProjectID, Unrouted, e, rejectedRequest("", nil, data))
	}
	return l.registerTool(ctx, d, data)
}

// registerTool writes a validated definition unless it is already in force.
func (l *Ledger) registerTool(ctx context.Context, d *ToolDefinition, data []byte) (RegisterResult, error) {
	subj := ToolSubject(l.version, d.ProjectID, d.ToolName)
	for range 8 {
		cur, err := l.lastForSubject(ctx, subj)
		if err != nil {
			return RegisterResult{}, fmt.Errorf("register tool %s: %w", d.ToolName, err)
		}
		var last uint64
		if cur != nil {
			if bytes.Equal(cur.Data, data) {
				return RegisterResult{ToolName: d.ToolName, Seq: cur.Sequence, Unchanged: true, Definition: *d}, nil
			}
			last = cur.Sequence
		}
		msg := &nats.Msg{Subject: subj, Data: data, Header: nats.Header{}}
		msg.Header.Set(HeaderProjectID, d.ProjectID)
		ack, err := l.appendEntry(ctx, KindTool, msg, jetstream.WithExpectLastSequencePerSubject(last))
		// Read-your-writes in this process, whatever the watch's delay.
		l.cache.changed(subj)
		if isWrongLastSeq(err) {
			continue // a concurrent registration won; compare with it
		}
		if err != nil {
			return RegisterResult{}, fmt.Errorf("register tool %s: %w", d.ToolName, err)
		}
		return RegisterResult{ToolName: d.ToolName, Seq: ack.Sequence, Definition: *d}, nil
	}
	return RegisterResult{}, fmt.Errorf("register tool %s: too many concurrent registrations", d.ToolName)
}

// GetTool reads the definition in force, or an error matching ErrNotFound.
func (l *Ledger) GetTool(ctx context.Context, project, tool string) (*StoredTool, error) {
	var vs Violations
	checkIdent(&vs, "project_id", project, true)
	checkIdent(&vs, "tool_name", tool, true)
	if err := badRequest("tool lookup", vs); err != nil {
		return nil, err
	}
	m, err := l.lastForSubject(ctx, ToolSubject(l.version, project, tool))
	if err != nil {
		return nil, fmt.Errorf("get tool %s: %w", tool, err)
	}
	if m == nil {
		return nil, newError(CodeNotFound, nil, "tool %s is not registered in project %s", tool, project)
	}
	st := &StoredTool{Seq: m.Sequence}
	if err := json.Unmarshal(m.Data, &st.Definition); err != nil {
		return nil, fmt.Errorf("get tool %s: decode entry %d: %w", tool, m.Sequence, err)
	}
	return st, nil
}

// ListTools reads every tool registered in a project, by name.
func (l *Ledger) ListTools(ctx context.Context, project string) ([]StoredTool, error) {
	var vs Violations
	checkIdent(&vs, "project_id", project, true)
	if err := badRequest("tool listing", vs); err != nil {
		return nil, err
	}
	info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(ToolSubject(l.version, project, "*")))
	if err != nil {
		return nil, fmt.Errorf("list tools: %w", err)
	}
	names := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		names = append(names, subj[strings.LastIndexByte(subj, '.')+1:])
	}
	sort.Strings(names)
	out := make([]StoredTool, 0, len(names))
	for _, n := range names {
		st, err := l.GetTool(ctx, project, n)
		if err != nil {
			return nil, err
		}
		out = append(out, *st)
	}
	return out, nil
}
