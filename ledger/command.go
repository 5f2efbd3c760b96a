package ledger

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

// inlineForbidden are the payload fields a tool command must not carry:
// arguments travel only in the tool.call card.
var inlineForbidden = []string{"args", "arguments", "result"}

// ToolCommandPayload is the business payload of a tool command.
type ToolCommandPayload struct {
	ToolCallCardID string `json:"tool_call_card_id"`
	ToolName       string `json:"tool_name,omitempty"`
	AfterExecution string `json:"after_execution"`
	// TimeoutMS optionally asks for a shorter or longer deadline than the
	// tool's default; executors cap it at the tool's timeout_ms_max.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

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
	sub := parseSubject(subject, &vs)
	if len(vs) == 0 && !sub.IsCommand() {
		vs.Add("subject", VInvalidSubject, "%q is a %s subject, not a tool or PMO command subject", clip(subject), sub.Kind)
	}
	cmd.Subject = sub
	rules := IdentityRules{RequireToolCallID: true, RequireStepID: sub.Kind == SubjectPMOCommand}
	id, hvs := ParseIdentity(h, rules)
	vs = append(vs, hvs...)
	cmd.Identity = id
	cmd.Payload = parseCommandPayload(data, sub, id, hvs, &vs)
	if err := badRequest("tool command", vs); err != nil {
		return nil, err
	}
	return cmd, nil
}

func parseCommandPayload(data []byte, sub Subject, id Identity, headerViolations Violations, vs *Violations) ToolCommandPayload {
	var p ToolCommandPayload
	o, ok := parseObject("payload", data, vs)
	if !ok {
		return p
	}
	for _, f := range inlineForbidden {
		if o.has(f) {
			vs.Add(o.path(f), VForbidden, "inline %s are not allowed: arguments are read from the tool.call card named by tool_call_card_id", f)
		}
	}
	p.ToolCallCardID = o.ident("tool_call_card_id", true)
	p.ToolName = o.name("tool_name", sub.Kind == SubjectPMOCommand)
	if sub.Kind == SubjectPMOCommand && p.ToolName != "" && sub.Tool != "" && p.ToolName != sub.Tool {
		vs.Add(o.path("tool_name"), VMismatch, "must equal the PMO tool in the subject (%q), got %q", sub.Tool, p.ToolName)
	}
	p.AfterExecution = o.str("after_execution", true)
	if p.AfterExecution != "" && !ValidAfterExecution(p.AfterExecution) {
		vs.Add(o.path("after_execution"), VInvalidValue, "must be %q or %q, got %q", AfterSuspend, AfterTerminate, clip(p.AfterExecution))
	}
	p.TimeoutMS = intField(o, "timeout_ms", 1, 24*3600*1000)
	checkPayloadIdentity(o, id, headerViolations, vs)
	return p
}

// checkPayloadIdentity enforces that identity fields repeated in a payload
// equal the CG-* headers, which are authoritative (seed 003).
func checkPayloadIdentity(o jsonObject, id Identity, headerViolations Violations, vs *Violations) {
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
		if o.raw(pr.field) == nil || headerBad["header."+pr.header] || pr.want == "" {
			continue
		}
		n := len(*vs)
		got := o.str(pr.field, false)
		if len(*vs) == n && got != pr.want {
			vs.Add(o.path(pr.field), VIdentityMismatch, "must equal header %s (%q), got %q", pr.header, pr.want, clip(got))
		}
	}
	if o.raw("turn_epoch") != nil && !headerBad["header."+HeaderTurnEpoch] {
		if n, ok := o.epoch("turn_epoch"); ok && n != id.TurnEpoch {
			vs.Add(o.path("turn_epoch"), VIdentityMismatch, "must equal header %s (%d), got %d", HeaderTurnEpoch, id.TurnEpoch, n)
		}
	}
}
