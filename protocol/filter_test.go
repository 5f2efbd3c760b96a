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
	} {
		require.Equal(t, want, got)
	}
	require.Empty(t, protocol.CallEntriesFilter("v1", "*", protocol.SubjectTool), "not a call entry")
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
