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

// FilterMatches reports whether a NATS filter (with * and >) matches a
// literal subject.
func FilterMatches(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range ft {
		if f == ">" {
			return len(st) > i
		}
		if i >= len(st) || (f != "*" && f != st[i]) {
			return false
		}
	}
	return len(ft) == len(st)
}

// SubjectVersion is the protocol version token of a subject or a filter
// of the grammar (cg.<ver>.…); ok is false when it has none that is valid.
func SubjectVersion(s string) (version string, ok bool) {
	toks := strings.SplitN(s, ".", 3)
	if len(toks) < 3 || !ValidVersion(toks[1]) {
		return "", false
	}
	return toks[1], true
}

// SubjectProject is the project token of a subject of the grammar
// (cg.<ver>.<project>.…), read without checking it, or "" when the subject
// has too few tokens to name one.
func SubjectProject(subject string) string {
	toks := strings.SplitN(subject, ".", 4)
	if len(toks) < 4 {
		return ""
	}
	return toks[2]
}

// CommandTarget is the first target token of a tool command subject
// (cg.<ver>.<project>.<channel>.cmd.tool.<target>…), read without checking
// it, or "" when the subject is not shaped as one.
func CommandTarget(subject string) string {
	toks := strings.SplitN(subject, ".", 8)
	if len(toks) < 7 || toks[4] != "cmd" || toks[5] != "tool" {
		return ""
	}
	return toks[6]
}

// ServesTool reports whether a consumer with these filters serves the tool
// of a command subject (cg.<ver>.<project>.<channel>.cmd.tool.<target>...):
// one of its filters takes the subject and names the target itself. A
// consumer that takes every tool's commands (the ledger's deadline keeper,
// cmd.tool.>), or the whole stream (the views, an auditor's reader), is
// always pulling and serves none of them: counted, it would keep every tool
// "available" for ever (found from outside).
func ServesTool(filters []string, subject string) bool {
	const target = 6
	for _, f := range filters {
		ft := strings.Split(f, ".")
		if len(ft) > target && ft[target] != "*" && ft[target] != ">" && FilterMatches(f, subject) {
			return true
		}
	}
	return false
}

// ChannelWakeupsFilter matches the wakeups of every worker target of one
// channel: cg.<ver>.<project>.<channel>.cmd.agent.*.wakeup, for a reader
// of a channel's wakeups (the wakeup entry is the mark that a report is
// finished). The ledger itself finds a call's wakeup by sequence after its
// report, not by this filter: a wildcard get makes the server match every
// subject of a block.
func ChannelWakeupsFilter(version, project, channel string) string {
	return WakeupSubject(version, project, channel, "*")
}

// ReportSweepEntry reads an entry's subject for the ledger's sweep: its
// kind when it is one the sweep reads (SubjectReport, SubjectWakeup,
// SubjectWakeupSkip; SubjectUnknown for any other), its project, and for a
// report or a skipped wakeup the call's turn and id (a wakeup's are in its
// headers). It reads the tokens only, without checking them, for a reader of
// the whole stream (which only the ledger writes): the sweep reads every
// entry in order, which costs the server far less than a consumer filtered
// on subjects that are nearly all different.
func ReportSweepEntry(subject string) (kind SubjectKind, project, turnID, callID string) {
	toks := strings.Split(subject, ".")
	if len(toks) != 8 || toks[0] != Root {
		return SubjectUnknown, "", "", ""
	}
	switch {
	case toks[4] == "ledger" && toks[5] == callEntryTokens[SubjectReport]:
		return SubjectReport, toks[2], toks[6], toks[7]
	case toks[4] == "ledger" && toks[5] == callEntryTokens[SubjectWakeupSkip]:
		return SubjectWakeupSkip, toks[2], toks[6], toks[7]
	case toks[4] == "cmd" && toks[5] == "agent" && toks[7] == "wakeup":
		return SubjectWakeup, toks[2], "", ""
	}
	return SubjectUnknown, "", "", ""
}
