package protocol

// The parsers of a worker's and a tool's requests on a call: roster.set,
// inbox.consume, cancel and report.resume. Each reads its body once and
// lists every violation; the ledger refuses a request with any.

// ParseRosterEntry reads a roster.set body, listing every violation.
func ParseRosterEntry(body []byte) (RosterEntry, Violations) {
	var vs Violations
	var e RosterEntry
	if o, ok := ParseObject("body", body, &vs); ok {
		e = RosterEntry{ProjectID: o.Ident("project_id", true), AgentID: o.Ident("agent_id", true), WorkerTarget: o.Ident("worker_target", true)}
	}
	return e, vs
}

// ParseConsumeRequest reads an inbox.consume body, listing every
// violation.
func ParseConsumeRequest(body []byte) (ConsumeRequest, Violations) {
	var vs Violations
	var r ConsumeRequest
	if o, ok := ParseObject("body", body, &vs); ok {
		r = ConsumeRequest{ProjectID: o.Ident("project_id", true), AgentID: o.Ident("agent_id", true),
			AgentTurnID: o.Ident("agent_turn_id", true), ToolCallID: o.Ident("tool_call_id", true)}
	}
	return r, vs
}

// ParseCancelRequest reads a cancel body (a worker's cancel of its own
// call), listing every violation.
func ParseCancelRequest(body []byte) (CancelRequest, Violations) {
	var vs Violations
	var r CancelRequest
	if o, ok := ParseObject("body", body, &vs); ok {
		r = CancelRequest{ProjectID: o.Ident("project_id", true), AgentID: o.Ident("agent_id", true),
			AgentTurnID: o.Ident("agent_turn_id", true), ToolCallID: o.Ident("tool_call_id", true), Reason: o.Str("reason", false)}
	}
	return r, vs
}

// ParseResumeRequest reads a report.resume body (the call whose stored
// report to replay; no channel), listing every violation.
func ParseResumeRequest(body []byte) (CallRef, Violations) {
	var vs Violations
	var r CallRef
	if o, ok := ParseObject("body", body, &vs); ok {
		r = CallRef{ProjectID: o.Ident("project_id", true), AgentTurnID: o.Ident("agent_turn_id", true), ToolCallID: o.Ident("tool_call_id", true)}
	}
	return r, vs
}
