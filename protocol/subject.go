package protocol

import (
	"strconv"
	"strings"
)

// Root is the first token of every ledger subject.
const Root = "cg"

// DefaultVersion is the protocol version token used when none is configured.
const DefaultVersion = "v1"

// SubjectKind says which part of the grammar a subject belongs to.
type SubjectKind int

// Subject kinds. Commands and wakeups are the L0 protocol's own subjects; the
// rest are the ledger's entries (docs/protocol.md, "Ledger entries").
const (
	SubjectUnknown     SubjectKind = iota
	SubjectToolCommand             // cg.<ver>.<p>.<c>.cmd.tool.<target>[.<more>...]
	SubjectPMOCommand              // cg.<ver>.<p>.<c>.cmd.sys.pmo.internal.<tool>
	SubjectWakeup                  // cg.<ver>.<p>.<c>.cmd.agent.<worker_target>.wakeup
	SubjectReport                  // cg.<ver>.<p>.<c>.ledger.report.<agent_turn_id>.<tool_call_id>
	SubjectDuplicate               // cg.<ver>.<p>.<c>.ledger.duplicate.<agent_turn_id>.<tool_call_id>
	SubjectWakeupSkip              // cg.<ver>.<p>.<c>.ledger.wakeup_skipped.<agent_turn_id>.<tool_call_id>
	SubjectConsumed                // cg.<ver>.<p>.<c>.ledger.consumed.<agent_turn_id>.<tool_call_id>
	SubjectCancel                  // cg.<ver>.<p>.<c>.ledger.cancel.<agent_turn_id>.<tool_call_id>
	SubjectRejection               // cg.<ver>.<p>.<c>.ledger.rejection.<reason>
	SubjectCard                    // cg.<ver>.<p>.card.<card_id>
	SubjectRoster                  // cg.<ver>.<p>.roster.<agent_id>
	SubjectTool                    // cg.<ver>.<p>.tool.<tool_name>
	SubjectSkip                    // cg.<ver>._._.ledger.skip.<seq>
	SubjectAttempt                 // cg.<ver>.<p>.<c>.ledger.attempt.<agent_turn_id>.<tool_call_id>
	SubjectPrepared                // cg.<ver>.<p>.<c>.ledger.prepared.<agent_turn_id>.<tool_call_id>
	SubjectHeld                    // cg.<ver>.<p>.<c>.ledger.held.<agent_turn_id>.<tool_call_id>
	SubjectApproval                // cg.<ver>.<p>.<c>.ledger.approval.<agent_turn_id>.<tool_call_id>
	SubjectResolution              // cg.<ver>.<p>.<c>.ledger.resolution.<agent_turn_id>.<tool_call_id>
	SubjectPause                   // cg.<ver>.<p>.pause.<tool_name>
	SubjectRedrive                 // cg.<ver>.<p>.<c>.ledger.redrive.<agent_turn_id>.<tool_call_id>
)

var subjectKindNames = map[SubjectKind]string{
	SubjectToolCommand: "tool_command",
	SubjectPMOCommand:  "pmo_command",
	SubjectWakeup:      "wakeup",
	SubjectReport:      "report",
	SubjectDuplicate:   "duplicate",
	SubjectWakeupSkip:  "wakeup_skipped",
	SubjectConsumed:    "consumed",
	SubjectCancel:      "cancel",
	SubjectRejection:   "rejection",
	SubjectCard:        "card",
	SubjectRoster:      "roster",
	SubjectTool:        "tool",
	SubjectSkip:        "skip",
	SubjectAttempt:     "attempt",
	SubjectPrepared:    "prepared",
	SubjectHeld:        "held",
	SubjectApproval:    "approval",
	SubjectResolution:  "resolution",
	SubjectPause:       "pause",
	SubjectRedrive:     "redrive",
}

// String names the kind as in entry kinds and metrics.
func (k SubjectKind) String() string {
	if n, ok := subjectKindNames[k]; ok {
		return n
	}
	return "unknown"
}

// Subject is a parsed ledger subject. Only the fields of its Kind are set.
type Subject struct {
	Kind    SubjectKind
	Version string
	Project string
	Channel string
	// Target holds the tokens after cmd.tool (at least one).
	Target []string
	// Tool is the PMO built-in tool name, or the tool of a tool or pause
	// entry.
	Tool string
	// WorkerTarget is the wakeup's worker target.
	WorkerTarget string
	// AgentTurnID and ToolCallID name the call of report/duplicate entries.
	AgentTurnID string
	ToolCallID  string
	// Reason is the rejection reason token.
	Reason string
	// CardID is the card of a card entry.
	CardID string
	// AgentID is the agent of a roster entry.
	AgentID string
	// Seq is the sequence a skip entry names.
	Seq uint64
}

// String builds the subject text.
func (s Subject) String() string {
	p := []string{Root, s.Version, s.Project}
	if tok, ok := callEntryTokens[s.Kind]; ok {
		return strings.Join(append(p, s.Channel, "ledger", tok, s.AgentTurnID, s.ToolCallID), ".")
	}
	switch s.Kind {
	case SubjectToolCommand:
		p = append(append(p, s.Channel, "cmd", "tool"), s.Target...)
	case SubjectPMOCommand:
		p = append(p, s.Channel, "cmd", "sys", "pmo", "internal", s.Tool)
	case SubjectWakeup:
		p = append(p, s.Channel, "cmd", "agent", s.WorkerTarget, "wakeup")
	case SubjectRejection:
		p = append(p, s.Channel, "ledger", "rejection", s.Reason)
	case SubjectCard:
		p = append(p, "card", s.CardID)
	case SubjectRoster:
		p = append(p, "roster", s.AgentID)
	case SubjectTool:
		p = append(p, "tool", s.Tool)
	case SubjectPause:
		p = append(p, "pause", s.Tool)
	case SubjectSkip:
		p = append(p, s.Channel, "ledger", "skip", strconv.FormatUint(s.Seq, 10))
	default:
		return ""
	}
	return strings.Join(p, ".")
}

// IsCommand reports whether the subject is a tool or PMO command.
func (s Subject) IsCommand() bool {
	return s.Kind == SubjectToolCommand || s.Kind == SubjectPMOCommand
}

// ValidVersion reports whether v is a protocol version token: 'v' and digits.
func ValidVersion(v string) bool {
	if len(v) < 2 || len(v) > 10 || v[0] != 'v' {
		return false
	}
	_, err := strconv.ParseUint(v[1:], 10, 32)
	return err == nil && v[1] != '+'
}

// ParseSubject parses any subject of the grammar. It returns a bad_request
// *Error listing every problem when s is not one.
func ParseSubject(s string) (Subject, error) {
	var vs Violations
	sub := DecodeSubject(s, &vs)
	if len(vs) > 0 {
		return Subject{}, BadRequest("subject", vs)
	}
	return sub, nil
}

// ParseCommandSubject parses a tool or PMO command subject.
func ParseCommandSubject(s string) (Subject, error) {
	sub, err := ParseSubject(s)
	if err != nil {
		return Subject{}, err
	}
	if !sub.IsCommand() {
		var vs Violations
		vs.Add("subject", VInvalidSubject, "%q is a %s subject, not cg.<ver>.<project_id>.<channel_id>.cmd.tool.<target>... or cmd.sys.pmo.internal.<tool>", Clip(s), sub.Kind)
		return Subject{}, BadRequest("subject", vs)
	}
	return sub, nil
}

// DecodeSubject is ParseSubject that adds every violation to vs under the
// field "subject" rather than returning an error.
func DecodeSubject(s string, vs *Violations) Subject {
	const field = "subject"
	toks := strings.Split(s, ".")
	if len(toks) < 5 || toks[0] != Root {
		vs.Add(field, VInvalidSubject, "%q does not match cg.<ver>.<project_id>...", Clip(s))
		return Subject{}
	}
	sub := Subject{Version: toks[1], Project: toks[2]}
	if !ValidVersion(sub.Version) {
		vs.Add(field, VInvalidSubject, "version token %q must be 'v' followed by digits", Clip(sub.Version))
	}
	tokenOK := func(name, t string) {
		if !ValidIdentifier(t) {
			vs.Add(field, VInvalidToken, "%s token %q is not a valid identifier", name, Clip(t))
		}
	}
	projectOK := func() { tokenOK("project_id", sub.Project) }
	fail := func() Subject {
		vs.Add(field, VInvalidSubject, "%q matches no subject of the grammar (see docs/protocol.md)", Clip(s))
		return Subject{}
	}
	// Project-scoped entries: cg.<ver>.<p>.card.<id>, cg.<ver>.<p>.roster.<agent>,
	// cg.<ver>.<p>.tool.<tool>, cg.<ver>.<p>.pause.<tool>.
	if len(toks) == 5 {
		switch toks[3] {
		case "card":
			sub.Kind, sub.CardID = SubjectCard, toks[4]
			projectOK()
			tokenOK("card_id", sub.CardID)
			return sub
		case "roster":
			sub.Kind, sub.AgentID = SubjectRoster, toks[4]
			projectOK()
			tokenOK("agent_id", sub.AgentID)
			return sub
		case "tool":
			sub.Kind, sub.Tool = SubjectTool, toks[4]
			projectOK()
			tokenOK("tool_name", sub.Tool)
			return sub
		case "pause":
			sub.Kind, sub.Tool = SubjectPause, toks[4]
			projectOK()
			tokenOK("tool_name", sub.Tool)
			return sub
		}
		return fail()
	}
	sub.Channel = toks[3]
	rest := toks[4:]
	routeOK := func() {
		// Rejections may carry the reserved Unrouted token in place of ids.
		if sub.Kind == SubjectRejection && sub.Project == Unrouted && sub.Channel == Unrouted {
			return
		}
		projectOK()
		tokenOK("channel_id", sub.Channel)
	}
	switch {
	case len(rest) >= 3 && rest[0] == "cmd" && rest[1] == "tool":
		sub.Kind, sub.Target = SubjectToolCommand, append([]string(nil), rest[2:]...)
		for _, t := range sub.Target {
			tokenOK("target", t)
		}
	case len(rest) == 5 && rest[0] == "cmd" && rest[1] == "sys" && rest[2] == "pmo" && rest[3] == "internal":
		sub.Kind, sub.Tool = SubjectPMOCommand, rest[4]
		tokenOK("tool", sub.Tool)
	case len(rest) == 4 && rest[0] == "cmd" && rest[1] == "agent" && rest[3] == "wakeup":
		sub.Kind, sub.WorkerTarget = SubjectWakeup, rest[2]
		tokenOK("worker_target", sub.WorkerTarget)
	case len(rest) == 4 && rest[0] == "ledger" && callEntryKinds[rest[1]] != SubjectUnknown:
		sub.Kind = callEntryKinds[rest[1]]
		sub.AgentTurnID, sub.ToolCallID = rest[2], rest[3]
		tokenOK("agent_turn_id", sub.AgentTurnID)
		tokenOK("tool_call_id", sub.ToolCallID)
	case len(rest) == 3 && rest[0] == "ledger" && rest[1] == "rejection":
		sub.Kind, sub.Reason = SubjectRejection, rest[2]
		tokenOK("reason", sub.Reason)
	case len(rest) == 3 && rest[0] == "ledger" && rest[1] == "skip":
		// Skips belong to the ledger as a whole, not to a project: the
		// project and channel tokens are always Unrouted.
		sub.Kind = SubjectSkip
		if sub.Project != Unrouted || sub.Channel != Unrouted {
			vs.Add(field, VInvalidSubject, "skip entries are under cg.<ver>._._.ledger.skip.<seq>, not %q", Clip(s))
		}
		n, ok := parseSeqToken(rest[2])
		if !ok {
			vs.Add(field, VInvalidToken, "seq token %q must be a sequence number (decimal, at least 1, no leading zeros)", Clip(rest[2]))
		}
		sub.Seq = n
		return sub
	default:
		return fail()
	}
	routeOK()
	return sub
}

// parseSeqToken parses a sequence token in its one canonical spelling, so
// that every skip has exactly one subject.
func parseSeqToken(t string) (uint64, bool) {
	if t == "" || t[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(t); i++ {
		if t[i] < '0' || t[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	return n, err == nil
}

// callEntryKinds are the ledger entries whose subject ends in
// <agent_turn_id>.<tool_call_id>.
var callEntryKinds = map[string]SubjectKind{
	"report":         SubjectReport,
	"duplicate":      SubjectDuplicate,
	"wakeup_skipped": SubjectWakeupSkip,
	"consumed":       SubjectConsumed,
	"cancel":         SubjectCancel,
	"attempt":        SubjectAttempt,
	"prepared":       SubjectPrepared,
	"held":           SubjectHeld,
	"approval":       SubjectApproval,
	"resolution":     SubjectResolution,
	"redrive":        SubjectRedrive,
}

// callEntryTokens is callEntryKinds the other way round: the token of each
// call entry's subject, which String writes.
var callEntryTokens = func() map[SubjectKind]string {
	m := make(map[SubjectKind]string, len(callEntryKinds))
	for tok, k := range callEntryKinds {
		m[k] = tok
	}
	return m
}()

// ToolCommandSubject builds cg.<ver>.<project>.<channel>.cmd.tool.<target...>.
func ToolCommandSubject(version, project, channel string, target ...string) string {
	return Subject{Kind: SubjectToolCommand, Version: version, Project: project, Channel: channel, Target: target}.String()
}

// PMOCommandSubject builds cg.<ver>.<project>.<channel>.cmd.sys.pmo.internal.<tool>.
func PMOCommandSubject(version, project, channel, tool string) string {
	return Subject{Kind: SubjectPMOCommand, Version: version, Project: project, Channel: channel, Tool: tool}.String()
}

// WakeupSubject builds cg.<ver>.<project>.<channel>.cmd.agent.<worker_target>.wakeup.
func WakeupSubject(version, project, channel, workerTarget string) string {
	return Subject{Kind: SubjectWakeup, Version: version, Project: project, Channel: channel, WorkerTarget: workerTarget}.String()
}

// CardSubject builds cg.<ver>.<project>.card.<card_id>.
func CardSubject(version, project, cardID string) string {
	return Subject{Kind: SubjectCard, Version: version, Project: project, CardID: cardID}.String()
}

// RosterSubject builds cg.<ver>.<project>.roster.<agent_id>.
func RosterSubject(version, project, agentID string) string {
	return Subject{Kind: SubjectRoster, Version: version, Project: project, AgentID: agentID}.String()
}

// ReportSubject builds cg.<ver>.<project>.<channel>.ledger.report.<agent_turn_id>.<tool_call_id>.
func ReportSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectReport, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// DuplicateSubject builds cg.<ver>.<project>.<channel>.ledger.duplicate.<agent_turn_id>.<tool_call_id>.
func DuplicateSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectDuplicate, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// WakeupSkippedSubject builds cg.<ver>.<project>.<channel>.ledger.wakeup_skipped.<agent_turn_id>.<tool_call_id>.
func WakeupSkippedSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectWakeupSkip, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// ConsumedSubject builds cg.<ver>.<project>.<channel>.ledger.consumed.<agent_turn_id>.<tool_call_id>.
func ConsumedSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectConsumed, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// CancelSubject builds cg.<ver>.<project>.<channel>.ledger.cancel.<agent_turn_id>.<tool_call_id>.
func CancelSubject(version, project, channel, turnID, callID string) string {
	return Subject{Kind: SubjectCancel, Version: version, Project: project, Channel: channel, AgentTurnID: turnID, ToolCallID: callID}.String()
}

// RejectionSubject builds cg.<ver>.<project>.<channel>.ledger.rejection.<reason>.
// Invalid or empty project or channel ids are replaced by Unrouted.
func RejectionSubject(version, project, channel string, reason Code) string {
	if !ValidIdentifier(project) || !ValidIdentifier(channel) {
		project, channel = Unrouted, Unrouted
	}
	return Subject{Kind: SubjectRejection, Version: version, Project: project, Channel: channel, Reason: string(reason)}.String()
}

// SkipSubject builds cg.<ver>._._.ledger.skip.<seq>.
func SkipSubject(version string, seq uint64) string {
	return Subject{Kind: SubjectSkip, Version: version, Project: Unrouted, Channel: Unrouted, Seq: seq}.String()
}

// CommandFilterTool says which tool's commands a NATS filter subject (with
// * and > wildcards) of a consumer takes. ok is false when the filter takes
// any subject that is not a tool or PMO command (a wakeup, a ledger entry,
// the whole stream). Otherwise the filter takes commands only: of the tool
// named by tool, or, with anyTool, of any tool (a wildcard in the tool's
// position: the first target token of cmd.tool.<target>..., or the tool of
// cmd.sys.pmo.internal.<tool>). Version, project and channel may be
// wildcards; the grammar's fixed tokens may not.
func CommandFilterTool(filter string) (tool string, anyTool, ok bool) {
	toks := strings.Split(filter, ".")
	if len(toks) < 7 || toks[0] != Root || toks[4] != "cmd" {
		return "", false, false
	}
	for _, t := range toks[1:4] {
		if t == ">" {
			return "", false, false
		}
	}
	var at int
	switch {
	case toks[5] == "tool":
		at = 6
	case len(toks) == 9 && toks[5] == "sys" && toks[6] == "pmo" && toks[7] == "internal":
		at = 8
	default:
		return "", false, false
	}
	switch t := toks[at]; {
	case t == "*" || t == ">":
		return "", true, true
	case !ValidIdentifier(t):
		return "", false, false
	default:
		return t, false, true
	}
}

// CancelSubjectPattern is the NATS pattern of every cancel entry of project
// in version's grammar, on any channel: cg.<ver>.<project>.*.ledger.cancel.>.
// A tool credential subscribes it to learn of cancelled calls.
func CancelSubjectPattern(version, project string) string {
	return strings.Join([]string{Root, version, project, "*", "ledger", "cancel", ">"}, ".")
}

// CommandSubjectPattern is the NATS pattern of every command of project in
// version's grammar (tool and PMO commands, wakeups), on any channel:
// cg.<ver>.<project>.*.cmd.>. Either may be "*".
func CommandSubjectPattern(version, project string) string {
	return strings.Join([]string{Root, version, project, "*", "cmd", ">"}, ".")
}

// ToolTargetTemplate is the target_subject of a tool definition whose
// commands go to target: cg.v1.{project_id}.{channel_id}.cmd.tool.<target...>,
// the placeholders filled per call by the dispatch.
func ToolTargetTemplate(target ...string) string {
	return ToolCommandSubject(DefaultVersion, "{project_id}", "{channel_id}", target...)
}
