// Package mcpbridge serves the tools of MCP servers as cgledger tools: it
// connects to each configured MCP server (stdio or streamable HTTP, with the
// official Go SDK), registers its tools in a project, and runs their calls
// on an executor bound to the ledger-kept consumer of the server's target,
// so deadlines, heartbeats, cancellation, result cards, reports,
// redelivery and the intent/outcome_unknown rule of side-effectful tools
// are the executor's. docs/mcp.md describes it.
package mcpbridge

import (
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/cgledger/cgledger/internal/yamlread"

	"github.com/cgledger/cgledger/protocol"
)

// Config is a bridge's configuration file: one project, one or more MCP
// servers.
type Config struct {
	Project string         `json:"project" yaml:"project"`
	Servers []ServerConfig `json:"servers" yaml:"servers"`

	// readVs are the problems ReadConfig met (unknown fields, values of
	// the wrong type); Validate lists them with its own.
	readVs protocol.Violations
}

// ServerConfig is one MCP server and how its tools are registered.
type ServerConfig struct {
	// Name names the server in logs and metrics (an identifier).
	Name string `json:"name" yaml:"name"`
	// Target is the implementation token of the tools' target_subject
	// (cmd.tool.<target>), and so the tool of the credential serving them.
	// Empty means "mcp_" + Name.
	Target string `json:"target" yaml:"target"`
	// Prefix is put before each MCP tool name to make its ledger name. Nil
	// means Name + "_"; "" keeps the MCP names.
	Prefix *string `json:"prefix" yaml:"prefix"`
	// Command is the stdio server's command line (argv). Exactly one of
	// Command and URL.
	Command []string `json:"command" yaml:"command"`
	// Env is added to the stdio server's environment.
	Env map[string]string `json:"env" yaml:"env"`
	// InheritEnv names variables of the bridge's environment the stdio
	// server gets besides the default few (HOME, PATH, USER...); nothing
	// else of the bridge's environment reaches it.
	InheritEnv []string `json:"inherit_env" yaml:"inherit_env"`
	// URL is the streamable HTTP server's endpoint.
	URL string `json:"url" yaml:"url"`
	// AuthEnv names the environment variable whose value is sent as the
	// AuthHeader of every HTTP request (only the name is configured; the
	// value is never recorded or logged).
	AuthEnv string `json:"auth_env" yaml:"auth_env"`
	// AuthHeader is the header AuthEnv's value goes in; empty means
	// Authorization.
	AuthHeader string `json:"auth_header" yaml:"auth_header"`
	// ConnectTimeoutMS bounds connecting and initializing; 0 means 30000.
	ConnectTimeoutMS int64 `json:"connect_timeout_ms" yaml:"connect_timeout_ms"`
	// RestartMinMS and RestartMaxMS bound the backoff between restarts of
	// a server that died (doubling from min to max); 0 means 500 and 30000.
	RestartMinMS int64 `json:"restart_min_ms" yaml:"restart_min_ms"`
	RestartMaxMS int64 `json:"restart_max_ms" yaml:"restart_max_ms"`
	// MaxInlineBytes bounds the binary data (images, audio, blobs) kept in
	// a result card; larger data is kept as a reference only. 0 means
	// 65536; negative keeps none.
	MaxInlineBytes int `json:"max_inline_bytes" yaml:"max_inline_bytes"`
	// Limits are the registered tools' limits; zero fields take the
	// ledger's defaults.
	Limits protocol.ToolLimits `json:"limits" yaml:"limits"`
	// Tools overrides per MCP tool name.
	Tools map[string]ToolOverride `json:"tools" yaml:"tools"`
}

// ToolOverride changes how one MCP tool is registered.
type ToolOverride struct {
	// Determinism replaces the one derived from the tool's annotations.
	Determinism string `json:"determinism" yaml:"determinism"`
	// Skip leaves the tool unregistered.
	Skip bool `json:"skip" yaml:"skip"`
}

// Defaults.
const (
	DefaultConnectTimeoutMS = 30_000
	DefaultRestartMinMS     = 500
	DefaultRestartMaxMS     = 30_000
	DefaultMaxInlineBytes   = 64 << 10
)

// LoadConfig reads a YAML or JSON bridge configuration and checks it.
func LoadConfig(path string) (*Config, error) {
	c, err := ReadConfig(path)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// ReadConfig reads a YAML or JSON bridge configuration without checking
// it (a caller that overrides a field validates afterwards). Fields are
// named as in JSON (the names `tools list --json` shows, limits'
// timeout_ms_default too). An unknown field or a value of the wrong type
// does not stop the reading: it is kept as a violation that Validate lists
// with every other problem. Only a file that cannot be read or is not YAML
// at all is an error here.
func ReadConfig(path string) (*Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mcpbridge: read config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid MCP bridge config " + path,
			Violations: protocol.Violations{{Field: "config", Code: protocol.VInvalidValue, Message: "is not YAML or JSON: " + err.Error()}}}
	}
	var c Config
	if len(doc.Content) > 0 {
		yamlread.Decode(doc.Content[0], &c, "", yamlread.Options{Tag: "json", Root: "config", Noun: "field"}, &c.readVs)
	}
	return &c, nil
}

// Validate fills the defaults and returns a bad_request error listing
// every problem, or nil.
func (c *Config) Validate() error {
	// What could not be read comes first; a field already named there is
	// not named again for the zero value it was left with.
	vs := append(protocol.Violations(nil), c.readVs...)
	named := map[string]bool{}
	for _, v := range c.readVs {
		named[v.Field] = true
	}
	protocol.CheckIdent(&vs, "project", c.Project, true)
	if len(c.Servers) == 0 {
		vs.Add("servers", protocol.VRequired, "at least one MCP server")
	}
	targets := map[string]bool{}
	for i := range c.Servers {
		s := &c.Servers[i]
		f := fmt.Sprintf("servers[%d].", i)
		protocol.CheckIdent(&vs, f+"name", s.Name, true)
		if s.Target == "" && s.Name != "" {
			s.Target = "mcp_" + s.Name
		}
		switch {
		case !implName(s.Target):
			vs.Add(f+"target", protocol.VInvalidValue, "must be 1 to 64 of A-Z a-z 0-9 _ -, got %q", s.Target)
		case reservedName(s.Target):
			vs.Add(f+"target", protocol.VReserved, "%q is a built-in's name", s.Target)
		case targets[s.Target]:
			vs.Add(f+"target", protocol.VInvalidValue, "%q is the target of another server", s.Target)
		}
		targets[s.Target] = true
		if s.Prefix == nil {
			p := s.Name + "_"
			s.Prefix = &p
		}
		switch {
		case len(s.Command) == 0 && s.URL == "":
			vs.Add(f+"command", protocol.VRequired, "one of command (stdio) and url (streamable HTTP)")
		case len(s.Command) > 0 && s.URL != "":
			vs.Add(f+"url", protocol.VInvalidValue, "command and url exclude each other")
		case s.URL != "" && !strings.HasPrefix(s.URL, "http://") && !strings.HasPrefix(s.URL, "https://"):
			vs.Add(f+"url", protocol.VInvalidValue, "must be an http(s) URL, got %q", s.URL)
		}
		if s.AuthEnv != "" && s.URL == "" {
			vs.Add(f+"auth_env", protocol.VInvalidValue, "only with url")
		}
		if s.AuthHeader == "" {
			s.AuthHeader = "Authorization"
		}
		for k, d := range map[string]*int64{"connect_timeout_ms": &s.ConnectTimeoutMS, "restart_min_ms": &s.RestartMinMS, "restart_max_ms": &s.RestartMaxMS} {
			if *d < 0 || *d > 3_600_000 {
				vs.Add(f+k, protocol.VInvalidValue, "must be 0 to 3600000, got %d", *d)
			}
		}
		if s.ConnectTimeoutMS == 0 {
			s.ConnectTimeoutMS = DefaultConnectTimeoutMS
		}
		if s.RestartMinMS == 0 {
			s.RestartMinMS = DefaultRestartMinMS
		}
		if s.RestartMaxMS == 0 {
			s.RestartMaxMS = DefaultRestartMaxMS
		}
		if s.RestartMaxMS < s.RestartMinMS {
			vs.Add(f+"restart_max_ms", protocol.VInvalidValue, "must be at least restart_min_ms (%d)", s.RestartMinMS)
		}
		if s.MaxInlineBytes == 0 {
			s.MaxInlineBytes = DefaultMaxInlineBytes
		}
		for name, o := range s.Tools {
			switch o.Determinism {
			case "", protocol.DeterminismPure, protocol.DeterminismIdempotent, protocol.DeterminismSideEffectful:
			default:
				vs.Add(f+"tools."+name+".determinism", protocol.VInvalidValue, "must be pure, idempotent or side_effectful, got %q", o.Determinism)
			}
		}
	}
	var out protocol.Violations
	for i, v := range vs {
		if i < len(c.readVs) || !named[v.Field] {
			out = append(out, v)
		}
	}
	if len(out) > 0 {
		return &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid MCP bridge config", Violations: out}
	}
	return nil
}

// implName is the executor's rule for implementation names.
func implName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// builtins are the executor's built-in tools, which apply to every
// project: an MCP tool may not take their names.
var builtins = []string{"echo", "sleep"}

// reservedName reports whether name belongs to a built-in (the executor's
// or a PMO one).
func reservedName(name string) bool {
	for _, b := range builtins {
		if name == b {
			return true
		}
	}
	return protocol.IsPMOTool(name)
}
