package protocol

import "strings"

// The NATS filters of the ledger's own readers and keepers: each built
// from the grammar here, so no other package spells a subject (the layout
// test internal/layout holds them to it). "*" matches one token, ">" the
// rest of a subject.

// AllSubjectsFilter matches every subject of the grammar, in every version:
// cg.>, the ledger stream's one subject filter.
const AllSubjectsFilter = Root + ".>"

// ToolEntriesFilter matches the tool definition entry of every tool in
// every project: cg.<ver>.*.tool.*.
func ToolEntriesFilter(version string) string {
	return Subject{Kind: SubjectTool, Version: version, Project: "*", Tool: "*"}.String()
}

// PauseEntriesFilter matches the pause entry of every tool in every
// project: cg.<ver>.*.pause.*.
func PauseEntriesFilter(version string) string {
	return Subject{Kind: SubjectPause, Version: version, Project: "*", Tool: "*"}.String()
}

// CallEntriesFilter matches the call entries of kind (a kind whose subject
// ends in <agent_turn_id>.<tool_call_id>: SubjectHeld, SubjectPrepared...)
// of project ("*" for any), on any channel:
// cg.<ver>.<project>.*.ledger.<kind>.*.*. It is "" for any other kind.
func CallEntriesFilter(version, project string, kind SubjectKind) string {
	if _, ok := callEntryTokens[kind]; !ok {
		return ""
	}
	return Subject{Kind: kind, Version: version, Project: project, Channel: "*", AgentTurnID: "*", ToolCallID: "*"}.String()
}

// ToolCommandsFilter matches every tool command of every project and
// channel: cg.<ver>.*.*.cmd.tool.>.
func ToolCommandsFilter(version string) string {
	return ToolCommandSubject(version, "*", "*", ">")
}

// PMOCommandsFilter matches the commands of PMO built-in tool (any with
// "*") of project ("*" for any), on any channel:
// cg.<ver>.<project>.*.cmd.sys.pmo.internal.<tool>.
func PMOCommandsFilter(version, project, tool string) string {
	return PMOCommandSubject(version, project, "*", tool)
}

// SkipFilter matches the skip entries of seq in every protocol version
// (cg.*._._.ledger.skip.<seq>), so a reader finds a skip whatever version
// the ledger that wrote it used.
func SkipFilter(seq uint64) string {
	return SkipSubject("*", seq)
}

// ProjectEntryPrefix is the prefix of every subject of project in
// version's grammar (cg.<ver>.<project>.), whose entries are the project's
// own; an unrouted entry (UnroutedEntryPrefix) may be the project's too,
// by its CG-Project-Id header.
func ProjectEntryPrefix(version, project string) string {
	return strings.Join([]string{Root, version, project, ""}, ".")
}

// UnroutedEntryPrefix is the prefix of every unrouted entry's subject in
// version's grammar: cg.<ver>._._. (a refusal of a request that named no
// valid project and channel, a skip).
func UnroutedEntryPrefix(version string) string {
	return strings.Join([]string{Root, version, Unrouted, Unrouted, ""}, ".")
}

// ToolEntryName is the tool name of a tool entry's subject
// (cg.<ver>.<project>.tool.<name>), or "" for any other subject. It reads
// the tokens only, not whether they are valid identifiers: a reader of the
// stream's subjects, which only the ledger writes.
func ToolEntryName(subject string) string {
	toks := strings.Split(subject, ".")
	if len(toks) != 5 || toks[0] != Root || toks[3] != "tool" {
		return ""
	}
	return toks[4]
}
