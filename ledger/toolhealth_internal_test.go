package ledger

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSubjectMatchesAsNATSDoes: the filters of the consumers that serve a
// tool (an executor's, a tool credential's) match its command subjects, and
// nothing else does.
func TestSubjectMatchesAsNATSDoes(t *testing.T) {
	subj := "cg.v1.proj.main.cmd.tool.pay"
	for _, f := range []string{subj, "cg.*.*.*.cmd.tool.pay", "cg.v1.proj.*.cmd.tool.pay", "cg.>", "cg.v1.proj.main.cmd.>", ">"} {
		require.True(t, subjectMatches(f, subj), f)
	}
	for _, f := range []string{"cg.*.*.*.cmd.tool.pay.>", "cg.v1.proj.*.cmd.tool.payroll", "cg.v1.other.*.cmd.tool.pay", "cg.*.*.*.cmd.tool", "cg.v1.proj.main.cmd.tool.pay.x"} {
		require.False(t, subjectMatches(f, subj), f)
	}
	require.True(t, subjectMatches("cg.*.*.*.cmd.tool.pay.>", "cg.v1.proj.main.cmd.tool.pay.refund"))
	require.False(t, servesTool(nil, subj), "a consumer of the whole stream serves no tool")
	require.False(t, servesTool([]string{"cg.*.*.*.cmd.tool.>"}, subj), "the deadline keeper takes every tool's commands and serves none")
	require.False(t, servesTool([]string{"cg.v1.*.*.cmd.tool.*"}, subj))
	require.False(t, servesTool([]string{"cg.*.*.*.cmd.tool.echo"}, subj))
	require.True(t, servesTool([]string{"cg.*.*.*.cmd.tool.echo", "cg.v1.proj.*.cmd.tool.pay"}, subj))
	require.True(t, servesTool([]string{"cg.*.*.*.cmd.tool.pay.>"}, "cg.v1.proj.main.cmd.tool.pay.refund"))
}
