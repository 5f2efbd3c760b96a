package protocol

import (
	"github.com/nats-io/nats.go"
)

// after_execution values.
const (
	AfterSuspend   = "suspend"
	AfterTerminate = "terminate"
)

// ValidAfterExecution reports whether s is suspend or terminate.
func ValidAfterExecution(s string) bool { return s == AfterSuspend || s == AfterTerminate }

// InlineForbidden are the payload fields a tool command must not carry:
// arguments travel only in the tool.call card.
var InlineForbidden = []string{"args", "arguments", "result"}

// ToolCommandPayload is the business payload of a tool command.
type ToolCommandPayload struct {
	ToolCallCardID string `json:"tool_call_card_id"`
	ToolName       string `json:"tool_name,omitempty"`
	AfterExecution string `json:"after_execution"`
	// TimeoutMS optionally asks for a shorter or longer deadline than the
	// tool's default; executors cap it at the tool's timeout_ms_max.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// DeadlineUnixMS is when the call must have its outcome, in Unix
	// milliseconds: fixed by the ledger at dispatch (timeout_ms, or the
	// tool's default, counted from dispatch) and written into the command
	// it publishes. A dispatcher never sets it; every delivery of the
	// command carries the same value (seed 004 deadline_unix_ms).
	DeadlineUnixMS int64 `json:"deadline_unix_ms,omitempty"`
}

// MaxDeadlineUnixMS bounds deadline_unix_ms (the year 9999), so that any
// decoder holds it in a 64-bit integer and a date.
const MaxDeadlineUnixMS = 253402300799999

// ToolCommand is a validated tool or PMO command.
type ToolCommand struct {
	Subject  Subject
	Identity Identity
	Payload  ToolCommandPayload
}

// ParseToolCommand validates a command's subject, CG-* headers and payload
// together and returns every violation at once as a bad_request *Error.
func ParseToolCommand(subject string, h nats.Header, data []byte) (*ToolCommand, error) {
	var vs Violations
	cmd := &ToolCommand{}
	sub := DecodeSubject(subject, &vs)
	if len(vs) == 0 && !sub.IsCommand() {
		vs.Add("subject", VInvalidSubject, "%q is a %s subject, not a tool or PMO command subject", Clip(subject), sub.Kind)
	}
	cmd.Subject = sub
	rules := IdentityRules{RequireToolCallID: true, RequireStepID: sub.Kind == SubjectPMOCommand}
	id, hvs := ParseIdentity(h, rules)
	vs = append(vs, hvs...)
	cmd.Identity = id
	cmd.Payload = DecodeCommandPayload(data, sub, id, hvs, &vs)
	if err := BadRequest("tool command", vs); err != nil {
		return nil, err
	}
	return cmd, nil
}

// DecodeCommandPayload reads a tool command's payload for subject sub and the
// identity id read from its headers (headerViolations are the identity's own
// violations, so fields are not refused twice), adding every violation to vs.
func DecodeCommandPayload(data []byte, sub Subject, id Identity, headerViolations Violations, vs *Violations) ToolCommandPayload {
	var p ToolCommandPayload
	o, ok := ParseObject("payload", data, vs)
	if !ok {
		return p
	}
	for _, f := range InlineForbidden {
		if o.Has(f) {
			vs.Add(o.Path(f), VForbidden, "inline %s are not allowed: arguments are read from the tool.call card named by tool_call_card_id", f)
		}
	}
	p.ToolCallCardID = o.Ident("tool_call_card_id", true)
	p.ToolName = o.Name("tool_name", sub.Kind == SubjectPMOCommand)
	if sub.Kind == SubjectPMOCommand && p.ToolName != "" && sub.Tool != "" && p.ToolName != sub.Tool {
		vs.Add(o.Path("tool_name"), VMismatch, "must equal the PMO tool in the subject (%q), got %q", sub.Tool, p.ToolName)
	}
	p.AfterExecution = o.Str("after_execution", true)
	if p.AfterExecution != "" && !ValidAfterExecution(p.AfterExecution) {
		vs.Add(o.Path("after_execution"), VInvalidValue, "must be %q or %q, got %q", AfterSuspend, AfterTerminate, Clip(p.AfterExecution))
	}
	p.TimeoutMS = intField(o, "timeout_ms", 1, 24*3600*1000)
	p.DeadlineUnixMS = intField(o, "deadline_unix_ms", 1, MaxDeadlineUnixMS)
	CheckPayloadIdentity(o, id, headerViolations, vs)
	return p
}

// CheckPayloadIdentity enforces that identity fields repeated in a payload
// equal the CG-* headers, which are authoritative (seed 003).
func CheckPayloadIdentity(o JSONObject, id Identity, headerViolations Violations, vs *Violations) {
	headerBad := map[string]bool{}
	for _, v := range headerViolations {
		headerBad[v.Field] = true
	}
	pairs := []struct{ field, header, want string }{
		{"agent_id", HeaderAgentID, id.AgentID},
		{"agent_turn_id", HeaderAgentTurnID, id.AgentTurnID},
		{"tool_call_id", HeaderToolCallID, id.ToolCallID},
		{"step_id", HeaderStepID, id.StepID},
		{"context_box_id", HeaderContextBoxID, id.ContextBoxID},
	}
	for _, pr := range pairs {
		// An optional header that is absent leaves nothing to compare with;
		// a required one that is absent is already a violation.
		if o.Raw(pr.field) == nil || headerBad["header."+pr.header] || pr.want == "" {
			continue
		}
		n := len(*vs)
		got := o.Str(pr.field, false)
		if len(*vs) == n && got != pr.want {
			vs.Add(o.Path(pr.field), VIdentityMismatch, "must equal header %s (%q), got %q", pr.header, pr.want, Clip(got))
		}
	}
	if o.Raw("turn_epoch") != nil && !headerBad["header."+HeaderTurnEpoch] {
		if n, ok := o.Epoch("turn_epoch"); ok && n != id.TurnEpoch {
			vs.Add(o.Path("turn_epoch"), VIdentityMismatch, "must equal header %s (%d), got %d", HeaderTurnEpoch, id.TurnEpoch, n)
		}
	}
}
