package protocol_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestFilters: each filter is the pattern the ledger's readers and keepers
// used when they spelled it themselves.
func TestFilters(t *testing.T) {
	for got, want := range map[string]string{
		protocol.AllSubjectsFilter:                                      "cg.>",
		protocol.ToolEntriesFilter("v1"):                                "cg.v1.*.tool.*",
		protocol.PauseEntriesFilter("v1"):                               "cg.v1.*.pause.*",
		protocol.CallEntriesFilter("v1", "p1", protocol.SubjectHeld):    "cg.v1.p1.*.ledger.held.*.*",
		protocol.CallEntriesFilter("v1", "*", protocol.SubjectPrepared): "cg.v1.*.*.ledger.prepared.*.*",
		protocol.CallEntriesFilter("v1", "*", protocol.SubjectApproval): "cg.v1.*.*.ledger.approval.*.*",
		protocol.CallEntriesFilter("v1", "*", protocol.SubjectRedrive):  "cg.v1.*.*.ledger.redrive.*.*",
		protocol.ToolCommandsFilter("v1"):                               "cg.v1.*.*.cmd.tool.>",
		protocol.PMOCommandsFilter("v1", "*", "*"):                      "cg.v1.*.*.cmd.sys.pmo.internal.*",
		protocol.PMOCommandsFilter("v1", "p1", "sleep"):                 "cg.v1.p1.*.cmd.sys.pmo.internal.sleep",
		protocol.SkipFilter(42):                                         "cg.*._._.ledger.skip.42",
		protocol.ProjectEntryPrefix("v1", "p1"):                         "cg.v1.p1.",
		protocol.UnroutedEntryPrefix("v1"):                              "cg.v1._._.",
		protocol.ChannelWakeupsFilter("v1", "p1", "c1"):                 "cg.v1.p1.c1.cmd.agent.*.wakeup",
	} {
		require.Equal(t, want, got)
	}
	require.Empty(t, protocol.CallEntriesFilter("v1", "*", protocol.SubjectTool), "not a call entry")
	for subject, want := range map[string][4]string{
		protocol.ReportSubject("v1", "p1", "c1", "t1", "k1"):        {"report", "p1", "t1", "k1"},
		protocol.WakeupSkippedSubject("v1", "p1", "c1", "t1", "k1"): {"wakeup_skipped", "p1", "t1", "k1"},
		protocol.WakeupSubject("v1", "p1", "c1", "w1"):              {"wakeup", "p1", "", ""},
		protocol.DuplicateSubject("v1", "p1", "c1", "t1", "k1"):     {"", "", "", ""},
		protocol.CardSubject("v1", "p1", "cc"):                      {"", "", "", ""},
	} {
		kind, p, turn, call := protocol.ReportSweepEntry(subject)
		name := map[protocol.SubjectKind]string{protocol.SubjectReport: "report", protocol.SubjectWakeupSkip: "wakeup_skipped", protocol.SubjectWakeup: "wakeup"}[kind]
		require.Equal(t, want, [4]string{name, p, turn, call}, subject)
	}
}

func TestToolEntryName(t *testing.T) {
	for subject, want := range map[string]string{
		"cg.v1.p1.tool.search":               "search",
		protocol.ToolEntriesFilter("v1"):     "*",
		"cg.v1.p1.pause.search":              "",
		"cg.v1.p1.tool.search.extra":         "",
		"cgx.v1.p1.tool.search":              "",
		"cg.v1.p1.c1.cmd.tool.search":        "",
		protocol.CardSubject("v1", "p", "c"): "",
	} {
		require.Equal(t, want, protocol.ToolEntryName(subject), subject)
	}
}

// TestFilterMatchesAsNATSDoes: the filters of the consumers that serve a
// tool (an executor's, a tool credential's) match its command subjects, and
// nothing else does (moved from the ledger's TestSubjectMatchesAsNATSDoes).
func TestFilterMatchesAsNATSDoes(t *testing.T) {
	subj := "cg.v1.proj.main.cmd.tool.pay"
	for _, f := range []string{subj, "cg.*.*.*.cmd.tool.pay", "cg.v1.proj.*.cmd.tool.pay", "cg.>", "cg.v1.proj.main.cmd.>", ">"} {
		require.True(t, protocol.FilterMatches(f, subj), f)
	}
	for _, f := range []string{"cg.*.*.*.cmd.tool.pay.>", "cg.v1.proj.*.cmd.tool.payroll", "cg.v1.other.*.cmd.tool.pay", "cg.*.*.*.cmd.tool", "cg.v1.proj.main.cmd.tool.pay.x"} {
		require.False(t, protocol.FilterMatches(f, subj), f)
	}
	require.True(t, protocol.FilterMatches("cg.*.*.*.cmd.tool.pay.>", "cg.v1.proj.main.cmd.tool.pay.refund"))
	require.False(t, protocol.ServesTool(nil, subj), "a consumer of the whole stream serves no tool")
	require.False(t, protocol.ServesTool([]string{"cg.*.*.*.cmd.tool.>"}, subj), "the deadline keeper takes every tool's commands and serves none")
	require.False(t, protocol.ServesTool([]string{"cg.v1.*.*.cmd.tool.*"}, subj))
	require.False(t, protocol.ServesTool([]string{"cg.*.*.*.cmd.tool.echo"}, subj))
	require.True(t, protocol.ServesTool([]string{"cg.*.*.*.cmd.tool.echo", "cg.v1.proj.*.cmd.tool.pay"}, subj))
	require.True(t, protocol.ServesTool([]string{"cg.*.*.*.cmd.tool.pay.>"}, "cg.v1.proj.main.cmd.tool.pay.refund"))
}

func TestSubjectTokens(t *testing.T) {
	v, ok := protocol.SubjectVersion("cg.v1.p1.*.cmd.tool.echo")
	require.True(t, ok)
	require.Equal(t, "v1", v)
	for _, s := range []string{"cg.v1", "cg.V1.p", "cg..p", ""} {
		_, ok := protocol.SubjectVersion(s)
		require.False(t, ok, s)
	}
	require.Equal(t, "p1", protocol.SubjectProject("cg.v1.p1.c1.cmd.tool.echo"))
	require.Equal(t, "p1", protocol.SubjectProject("cg.v1.p1.c1"))
	require.Empty(t, protocol.SubjectProject("cg.v1.p1"))
	require.Equal(t, "echo", protocol.CommandTarget("cg.v1.p1.c1.cmd.tool.echo"))
	require.Equal(t, "pay", protocol.CommandTarget("cg.v1.p1.c1.cmd.tool.pay.refund.x"))
	for _, s := range []string{"cg.v1.p1.c1.cmd.sys.pmo.internal.sleep", "cg.v1.p1.c1.cmd.tool", "cg.v1.p1.tool.echo"} {
		require.Empty(t, protocol.CommandTarget(s), s)
	}
}
