// Package jina is the HTTP tool of a vendor's API, Jina search and reader
// (seed 003 section 4): a tool registered with options.jina and a
// target_subject under cmd.tool.http runs on it. It holds what is the
// vendor's: the options it reads, their check at registration, its default
// hosts and key variable. The executor and the protocol name no vendor.
package jina

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/protocol"
)

// OptionsKey is the member of a tool definition's options that configures
// the tool: options.jina.
const OptionsKey = "jina"

// Options are a tool definition's options.jina.
type Options struct {
	Mode    string `json:"mode"`
	BaseURL string `json:"base_url"`
	Path    string `json:"path,omitempty"`
	Method  string `json:"method,omitempty"`
	AuthEnv string `json:"auth_env,omitempty"`
}

// Registration checks options.jina of every definition the ledger takes,
// wherever this package is linked in (serve links it).
func init() { protocol.RegisterOptions(OptionsKey, CheckOptions) }

// CheckOptions validates options.jina (raw, at field path field), adding
// every violation to vs.
func CheckOptions(field string, raw json.RawMessage, vs *protocol.Violations) {
	var j Options
	if err := json.Unmarshal(raw, &j); err != nil {
		vs.Add(field, protocol.VInvalidType, "must be an object: %v", err)
		return
	}
	if j.Mode != "search" && j.Mode != "reader" {
		vs.Add(field+".mode", protocol.VInvalidValue, `must be "search" or "reader", got %q`, protocol.Clip(j.Mode))
	}
	if !strings.HasPrefix(j.BaseURL, "https://") && !strings.HasPrefix(j.BaseURL, "http://") {
		vs.Add(field+".base_url", protocol.VInvalidValue, "must be an http(s) URL, got %q", protocol.Clip(j.BaseURL))
	}
	if j.Method != "" && j.Method != "GET" && j.Method != "POST" {
		vs.Add(field+".method", protocol.VInvalidValue, "must be GET or POST, got %q", protocol.Clip(j.Method))
	}
	if j.AuthEnv != "" && !protocol.ValidEnvName(j.AuthEnv) {
		vs.Add(field+".auth_env", protocol.VInvalidValue, "must be an environment variable name, got %q", protocol.Clip(j.AuthEnv))
	}
}

// OptionsOf reads options.jina of a definition: nil when it has none.
func OptionsOf(d *protocol.ToolDefinition) (*Options, error) {
	if d == nil || len(d.Options) == 0 {
		return nil, nil
	}
	var o struct {
		Jina *Options `json:"jina"`
	}
	if err := json.Unmarshal(d.Options, &o); err != nil {
		return nil, fmt.Errorf("tool %s: decode options.jina: %w", d.ToolName, err)
	}
	return o.Jina, nil
}

// Register registers the tool with e under implementation name "http":
// register tools with target_subject
// cg.v1.{project_id}.{channel_id}.cmd.tool.http.<anything> and options.jina.
// A configuration Validate refuses is refused with its every problem.
func Register(e *executor.Executor, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("jina: %w", err)
	}
	return e.Register("http", New(cfg), nil)
}
