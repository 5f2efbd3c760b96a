package protocol

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// Conformance: cgledger conformance drives a tool service through the
// protocol's golden and error cases (docs/conformance.md). Most error cases
// need commands no dispatch publishes, and only the ledger writes the
// ledger, so an admin asks the ledger to append them (conformance.command)
// and reads what the service then did (conformance.observe).
const (
	// OpConformanceCommand appends a tool command an admin describes,
	// marked as conformance traffic: an admin's only.
	OpConformanceCommand = "conformance.command"
	// OpConformanceObserve reads a project's entries from a sequence on and
	// the state of a tool target's consumers: an admin's only.
	OpConformanceObserve = "conformance.observe"
)

// HeaderConformance marks an entry written for a conformance run: its value
// is the run id. The ledger sets it on conformance.command's commands (and
// nobody may send it); a conformance run's dispatches carry it too, so the
// calls of a run are told from real traffic in the audit.
const HeaderConformance = "CG-Conformance"

// HeaderConformanceCase names, beside HeaderConformance, the case of the run
// a conformance command was written for.
const HeaderConformanceCase = "CG-Conformance-Case"

// ConformanceAgentPrefix starts the agent id of every call a conformance run
// dispatches (conformance-<run>), and ConformanceTurnPrefix its turn ids:
// views and exports show a run's calls under agents of that name.
const (
	ConformanceAgentPrefix = "conformance-"
	ConformanceTurnPrefix  = "conf-"
)

// MaxObserveEntries bounds the entries one conformance.observe answer holds.
const MaxObserveEntries = 1000

// ConformanceCommandRequest is the body of conformance.command.
type ConformanceCommandRequest struct {
	ProjectID string `json:"project_id"`
	// Run and Case identify the command (one per run and case): the entry's
	// Nats-Msg-Id is conformance.<project>.<run>.<case>.
	Run  string `json:"run"`
	Case string `json:"case"`
	// Subject is a tool command subject of the project:
	// cg.<ver>.<project>.<channel>.cmd.tool.<target>[...], not a decision's.
	Subject string `json:"subject"`
	// Headers are the command's headers as the service will see them
	// (the CG-* identity, traceparent, ...), malformed ones included.
	Headers map[string][]string `json:"headers,omitempty"`
	// Payload is the command's body: any JSON value, written as given.
	Payload json.RawMessage `json:"payload"`
}

// ConformanceCommandResult answers conformance.command.
type ConformanceCommandResult struct {
	Seq       uint64 `json:"seq"`
	Subject   string `json:"subject"`
	Duplicate bool   `json:"duplicate"`
}

// ConformanceObserveRequest is the body of conformance.observe.
type ConformanceObserveRequest struct {
	ProjectID string `json:"project_id"`
	// Tool is the tool target whose consumers are reported (optional).
	Tool string `json:"tool,omitempty"`
	// FromSeq is the first sequence read (at least 1).
	FromSeq uint64 `json:"from_seq"`
}

// ConformanceObserveResult answers conformance.observe: the project's
// entries from from_seq on (at most MaxObserveEntries; next_seq continues
// when truncated) and the consumers that deliver the tool's commands.
type ConformanceObserveResult struct {
	LastSeq   uint64                `json:"last_seq"`
	Entries   []Entry               `json:"entries"`
	Truncated bool                  `json:"truncated,omitempty"`
	NextSeq   uint64                `json:"next_seq"`
	Consumers []ConformanceConsumer `json:"consumers"`
}

// ConformanceConsumer is one durable consumer of the ledger stream that
// delivers a tool target's commands, as the server holds it.
type ConformanceConsumer struct {
	Name string `json:"name"`
	// AckFloorStreamSeq: every command of the consumer up to this stream
	// sequence is acknowledged.
	AckFloorStreamSeq uint64 `json:"ack_floor_stream_seq"`
	// DeliveredStreamSeq is the last stream sequence delivered, and
	// DeliveredConsumerSeq counts deliveries (redeliveries included).
	DeliveredStreamSeq   uint64 `json:"delivered_stream_seq"`
	DeliveredConsumerSeq uint64 `json:"delivered_consumer_seq"`
	NumAckPending        int    `json:"num_ack_pending"`
	NumRedelivered       int    `json:"num_redelivered"`
	NumPending           uint64 `json:"num_pending"`
	NumWaiting           int    `json:"num_waiting"`
	AckWaitMS            int64  `json:"ack_wait_ms"`
}

// conformanceBodySlack is what a conformance.command body may hold besides
// its payload: the headers at their limit, the other members and JSON
// escaping of both.
const conformanceBodySlack = 2*MaxHeaderBytes + 8<<10

// conformanceReserved are header names a conformance command may not
// carry: the ledger sets them (or they are JetStream's).
var conformanceReserved = []string{HeaderEntryKind, HeaderConformance, HeaderConformanceCase, HeaderActor, HeaderTime,
	HeaderIdempotencyKey, HeaderProjectID, HeaderChannelID}

// ParseConformanceCommand validates a conformance.command body, listing
// every violation.
func ParseConformanceCommand(data []byte) (ConformanceCommandRequest, Violations) {
	var r ConformanceCommandRequest
	var vs Violations
	// The payload has the limit of a command's payload, so the body around
	// it may pass MaxRequestBytes by its headers and members: a payload
	// too large is then named as such, on body.payload.
	if len(data) > MaxRequestBytes+conformanceBodySlack {
		vs.Add("body", VTooLarge, "is %d bytes; the limit is %d", len(data), MaxRequestBytes+conformanceBodySlack)
		return r, vs
	}
	o, ok := parseMember("body", data, &vs)
	if !ok {
		return r, vs
	}
	CheckDuplicateKeys("body", bytes.TrimSpace(data), &vs, "payload")
	onlyMembers(o, OpConformanceCommand, "project_id", "run", "case", "subject", "headers", "payload")
	r.ProjectID, r.Run, r.Case = o.Ident("project_id", true), o.Ident("run", true), o.Ident("case", true)
	r.Subject = o.Str("subject", true)
	if r.Subject != "" {
		sub, err := ParseSubject(r.Subject)
		switch {
		case err != nil || sub.Kind != SubjectToolCommand:
			vs.Add(o.Path("subject"), VInvalidSubject, "must be a tool command subject, %s.<ver>.<project_id>.<channel_id>.cmd.tool.<target>[...] with identifier tokens; got %q", Root, Clip(r.Subject))
		case IsDecisionSubject(sub):
			vs.Add(o.Path("subject"), VInvalidSubject, "a decision subject (<target>.%s.<turn>.<call>) is the ledger's commit or abort, not a command; got %q", DecisionToken, Clip(r.Subject))
		}
	}
	if raw := o.Raw("headers"); raw != nil && string(raw) != "null" {
		if err := json.Unmarshal(raw, &r.Headers); err != nil {
			vs.Add(o.Path("headers"), VInvalidType, "must map header names to arrays of strings")
		}
		size := 0
		for _, name := range slices.Sorted(maps.Keys(r.Headers)) {
			at := o.Path("headers") + "." + name
			if !validHeaderName(name) {
				vs.Add(at, VInvalidValue, "%q is not a header name: printable ASCII without ':' or spaces", Clip(name))
				continue
			}
			lower := strings.ToLower(name)
			if strings.HasPrefix(lower, "nats-") || slices.ContainsFunc(conformanceReserved, func(s string) bool { return strings.EqualFold(s, name) }) {
				vs.Add(at, VForbidden, "the ledger sets %s on a conformance command; it may not be given", Clip(name))
			}
			for _, v := range r.Headers[name] {
				size += len(name) + len(v) + 4
				switch {
				case strings.ContainsAny(v, "\r\n"):
					vs.Add(at, VInvalidValue, "a value holds a line break, which no header value can")
				case !utf8.ValidString(v):
					vs.Add(at, VInvalidUTF8, "a value is not valid UTF-8")
				}
			}
		}
		if size > MaxHeaderBytes {
			vs.Add(o.Path("headers"), VTooLarge, "the headers are %d bytes; the limit is %d", size, MaxHeaderBytes)
		}
	}
	r.Payload = o.Raw("payload")
	if r.Payload == nil && o.Has("payload") {
		r.Payload = json.RawMessage("null")
	}
	switch {
	case r.Payload == nil:
		vs.Add(o.Path("payload"), VRequired, "is required: the command's body (any JSON value)")
	case len(r.Payload) > MaxRequestBytes:
		vs.Add(o.Path("payload"), VTooLarge, "is %d bytes; the limit is %d", len(r.Payload), MaxRequestBytes)
	}
	return r, vs
}

// ParseConformanceObserve validates a conformance.observe body.
func ParseConformanceObserve(data []byte) (ConformanceObserveRequest, Violations) {
	var r ConformanceObserveRequest
	var vs Violations
	o, ok := ParseObject("body", data, &vs)
	if !ok {
		return r, vs
	}
	onlyMembers(o, OpConformanceObserve, "project_id", "tool", "from_seq")
	r.ProjectID, r.Tool = o.Ident("project_id", true), o.Ident("tool", false)
	if raw := o.Raw("from_seq"); raw == nil {
		vs.Add(o.Path("from_seq"), VRequired, "is required: the first sequence to read (at least 1)")
	} else {
		var n json.Number
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		i, err := int64(0), d.Decode(&n)
		if err == nil {
			i, err = n.Int64()
		}
		switch {
		case err != nil:
			vs.Add(o.Path("from_seq"), VInvalidType, "must be an integer, got %s", Clip(string(raw)))
		case i < 1:
			vs.Add(o.Path("from_seq"), VInvalidValue, "must be at least 1, got %d", i)
		default:
			r.FromSeq = uint64(i)
		}
	}
	return r, vs
}

// ConformanceMsgID is the Nats-Msg-Id of a conformance command: one per
// project, run and case.
func ConformanceMsgID(project, run, kase string) string {
	return "conformance." + project + "." + run + "." + kase
}
