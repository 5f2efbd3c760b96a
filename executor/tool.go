package executor

import (
	"context"
	"encoding/json"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Tool is what a tool implementer writes: run one attempt of a call and
// return exactly one Outcome. The context carries the call's deadline and is
// canceled when the worker cancels the call or the executor shuts down.
type Tool interface {
	Run(ctx context.Context, call *Call) Outcome
}

// Reconciler is implemented by a side_effectful tool that can find out,
// after a crash, whether an attempt it may have run took effect (by asking
// the upstream about the call's IdempotencyKey, say). The executor calls it,
// instead of Run, for a call whose latest attempt is on record without an
// outcome (docs/side-effects.md). done=true answers the call with o, marked
// reconciled; done=false closes the attempt as not done and the tool runs
// again as the next attempt. An error means it cannot tell yet: the command
// is redelivered and Reconcile asked again. Without a Reconciler such a call
// ends failed with S-TOOL-OUTCOME-UNKNOWN, never run again.
type Reconciler interface {
	Reconcile(ctx context.Context, call *Call) (done bool, o Outcome, err error)
}

// ToolFunc adapts a function to Tool.
type ToolFunc func(ctx context.Context, call *Call) Outcome

// Run implements Tool.
func (f ToolFunc) Run(ctx context.Context, call *Call) Outcome { return f(ctx, call) }

// Call is one tool call as a Tool sees it.
type Call struct {
	ProjectID   string
	ChannelID   string
	AgentID     string
	AgentTurnID string
	TurnEpoch   uint64
	ToolCallID  string
	// StepID is the CG-Step-Id of the command or, without one, the
	// tool.call card's metadata.step_id (as the {step_id} template
	// variable is).
	StepID       string
	ContextBoxID string
	ToolName     string
	// Arguments are the final arguments: the tool.call card's, with the
	// registry's defaults, fixed values, environment values and template
	// variables applied, validated against the tool's schema. They are
	// decoded as encoding/json does with UseNumber: a number is a
	// json.Number (so an integer past 2^53 keeps its digits), never a
	// float64.
	Arguments map[string]any
	// Definition is the tool's registry entry (or its built-in default).
	Definition *protocol.ToolDefinition
	// Options are the definition's decoded options.
	Options protocol.ToolOptions
	// Attempt counts attempts of this delivery, from 1. For a
	// side_effectful tool it is the attempt's number on record
	// (attempt.start), counted over every delivery of the call.
	Attempt int
	// IdempotencyKey is the call's stable key (protocol.IdempotencyKey): the
	// same for every delivery, attempt and executor of this call, different
	// for every other call. Hand it to an upstream that deduplicates.
	IdempotencyKey string
	// Deadline is when the call must have its outcome: fixed at dispatch
	// (the command's deadline_unix_ms), the same for every delivery and
	// attempt. Timeout is the budget it was computed from, counted from
	// dispatch.
	Deadline time.Time
	Timeout  time.Duration

	// resultSchema is the definition's compiled result_schema, nil when it
	// has none.
	resultSchema *jsonschema.Schema
	// progress records Progress; nil on a Call the executor did not make.
	progress *progressLog
}

// ArgString returns a string argument, or "" when absent or not a string.
func (c *Call) ArgString(name string) string {
	s, _ := c.Arguments[name].(string)
	return s
}

// ArgDuration reads a numeric argument as milliseconds.
func (c *Call) ArgDuration(name string) (time.Duration, bool) {
	switch v := c.Arguments[name].(type) {
	case json.Number:
		f, err := v.Float64()
		return time.Duration(f * float64(time.Millisecond)), err == nil
	case float64:
		return time.Duration(v * float64(time.Millisecond)), true
	case int:
		return time.Duration(v) * time.Millisecond, true
	}
	return 0, false
}
