package executor

import (
	"context"
	"encoding/json"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// builtinDefinition is the definition a built-in tool has in projects that
// did not register one of their own.
func builtinDefinition(name, description, parameters string, timeoutMS, timeoutMaxMS int64) *protocol.ToolDefinition {
	return &protocol.ToolDefinition{
		ToolName:       name,
		Description:    description,
		Parameters:     json.RawMessage(parameters),
		TargetSubject:  protocol.ToolTargetTemplate(name),
		AfterExecution: protocol.AfterSuspend,
		Limits:         protocol.ToolLimits{TimeoutMSDefault: timeoutMS, TimeoutMSMax: timeoutMaxMS, ConcurrencyMax: protocol.DefaultConcurrencyMax},
		Determinism:    protocol.DeterminismPure,
		Retry:          protocol.RetryPolicy{MaxAttempts: protocol.DefaultMaxAttempts, BaseMS: protocol.DefaultRetryBaseMS, CapMS: protocol.DefaultRetryCapMS},
	}
}

// Echo returns its arguments.
var Echo = ToolFunc(func(_ context.Context, call *Call) Outcome {
	return Success(call.Arguments)
})

// EchoDefinition is echo's built-in definition: any object of arguments.
var EchoDefinition = builtinDefinition("echo", "Returns its arguments.", `{"type":"object"}`, 10_000, 60_000)

// Sleep waits arguments.ms milliseconds (or until its deadline or
// cancellation), for deadline and cancellation tests and demos.
var Sleep = ToolFunc(func(ctx context.Context, call *Call) Outcome {
	d, _ := call.ArgDuration("ms")
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return Success(map[string]any{"slept_ms": d.Milliseconds()})
	case <-ctx.Done():
		return Retryable(CodeTimeout, "interrupted while sleeping", 0)
	}
})

// SleepDefinition is sleep's built-in definition.
var SleepDefinition = builtinDefinition("sleep", "Sleeps for ms milliseconds.",
	`{"type":"object","properties":{"ms":{"type":"integer","minimum":0,"maximum":3600000}},"required":["ms"],"additionalProperties":false}`,
	30_000, 3_600_000)

// RegisterBuiltins registers echo and sleep. The HTTP tool of a vendor's
// API is in a package of its own (executor/jina, which serve registers too).
func RegisterBuiltins(e *Executor) error {
	if err := e.Register("echo", Echo, EchoDefinition); err != nil {
		return err
	}
	return e.Register("sleep", Sleep, SleepDefinition)
}
