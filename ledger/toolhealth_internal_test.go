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
	require.True(t, anyFilterMatches(nil, subj), "a consumer without a filter takes every entry")
	require.False(t, anyFilterMatches([]string{"cg.*.*.*.cmd.tool.echo"}, subj))
}
