package protocol

import "encoding/json"

// Operator actions: pausing and resuming a tool (docs/operations.md,
// "Operator actions"). A tool's pause state is the last entry on its pause
// subject, cg.<ver>.<project>.pause.<tool_name>; while it says paused, a
// dispatch of the tool is held (a held entry with reason HeldPaused, call
// state StatePaused) instead of published, and a resume publishes the held
// commands in dispatch order.

// KindToolPause is the entry kind of a pause or a resume of a tool, on
// PauseSubject.
const KindToolPause EntryKind = "tool_pause"

// Pause operations (admin of the project).
const (
	OpToolPause  = "tool.pause"
	OpToolResume = "tool.resume"
)

// StatePaused is the call record state of a call held because its tool is
// paused: no command exists; resume publishes it, or the deadline keeper
// times it out at its deadline.
const StatePaused = "paused"

// HeldPaused is the reason of a held entry of a call whose tool was paused
// at dispatch (or when its approval would have released it).
const HeldPaused = "paused"

// PauseSubject builds cg.<ver>.<project>.pause.<tool_name>.
func PauseSubject(version, project, tool string) string {
	return Subject{Kind: SubjectPause, Version: version, Project: project, Tool: tool}.String()
}

// ToolPauseEntry is the data of a tool_pause entry: the tool's state from
// this entry on.
type ToolPauseEntry struct {
	ProjectID string `json:"project_id"`
	ToolName  string `json:"tool_name"`
	// Paused is true for a pause, false for a resume.
	Paused bool `json:"paused"`
	// Actor is the admin credential's actor token (also in CG-Actor).
	Actor  string `json:"actor"`
	Reason string `json:"reason"`
	// PauseSeq, on a resume, is the sequence of the pause it ends: the
	// calls it releases are the held entries of the tool between the two.
	PauseSeq uint64 `json:"pause_seq,omitempty"`
}

// ToolPauseRequest is the body of tool.pause and tool.resume.
type ToolPauseRequest struct {
	ProjectID string `json:"project_id"`
	ToolName  string `json:"tool_name"`
	Reason    string `json:"reason"`
}

// ToolPauseResult is the answer of tool.pause and tool.resume.
type ToolPauseResult struct {
	// Seq is the tool_pause entry's sequence.
	Seq      uint64 `json:"seq"`
	ToolName string `json:"tool_name"`
	Paused   bool   `json:"paused"`
	// Released is, for a resume, the number of held calls whose commands
	// it published (calls that ended while paused are not released).
	Released int `json:"released,omitempty"`
}

// MarshalJSON sends a resume's released always, 0 included (docs/protocol.md
// lists it in every resume answer); a pause's answer has none.
func (r ToolPauseResult) MarshalJSON() ([]byte, error) {
	type plain ToolPauseResult
	if r.Paused {
		return json.Marshal(plain(r))
	}
	return json.Marshal(struct {
		plain
		Released int `json:"released"`
	}{plain(r), r.Released})
}

// ParseToolPauseRequest reads a tool.pause or tool.resume body, listing
// every violation.
func ParseToolPauseRequest(body []byte) (ToolPauseRequest, Violations) {
	var vs Violations
	var r ToolPauseRequest
	o, ok := ParseObject("body", body, &vs)
	if !ok {
		return r, vs
	}
	r.ProjectID = o.Ident("project_id", true)
	r.ToolName = o.Ident("tool_name", true)
	r.Reason = operatorReason(o)
	onlyMembers(o, "tool.pause or tool.resume", "project_id", "tool_name", "reason")
	return r, vs
}
