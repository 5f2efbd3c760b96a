package protocol_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestCommandFilterTool: which tool a consumer's filter subject takes the
// commands of, for the filters the executor, a tool service's consumer
// (tool.consumer) and the deadline keeper use, and filters that take more
// than commands.
func TestCommandFilterTool(t *testing.T) {
	type want struct {
		tool        string
		anyTool, ok bool
	}
	for filter, w := range map[string]want{
		"cg.*.*.*.cmd.tool.echo":                       {tool: "echo", ok: true},
		"cg.*.*.*.cmd.tool.echo.>":                     {tool: "echo", ok: true},
		"cg.v1.proj.*.cmd.tool.search":                 {tool: "search", ok: true},
		"cg.v1.proj.*.cmd.sys.pmo.internal.delegate":   {tool: "delegate", ok: true},
		"cg.v1.*.*.cmd.tool.>":                         {anyTool: true, ok: true},
		"cg.v1.*.*.cmd.tool.*.x":                       {anyTool: true, ok: true},
		"cg.v1.*.*.cmd.sys.pmo.internal.*":             {anyTool: true, ok: true},
		"cg.v1.*.*.ledger.prepared.*.*":                {},
		"cg.v1.*.*.cmd.agent.w.wakeup":                 {},
		"cg.v1.*.*.cmd.*.echo":                         {},
		"cg.v1.>":                                      {},
		">":                                            {},
		"cg.v1.proj.>.cmd.tool.echo":                   {},
		"cg.v1.proj.c.cmd.tool.":                       {},
		"cg.v1.proj.c.cmd.sys.pmo.internal.delegate.x": {},
	} {
		tool, anyTool, ok := protocol.CommandFilterTool(filter)
		require.Equal(t, w, want{tool, anyTool, ok}, filter)
	}
}
