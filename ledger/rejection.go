package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// Operation names, as recorded in rejection entries and metrics.
const (
	OpCardPut      = "card.put"
	OpDispatch     = "dispatch"
	OpReport       = "report"
	OpRosterSet    = "roster.set"
	OpConsume      = "inbox.consume"
	OpToolRegister = "tool.register"
	OpCancel       = "cancel"
	OpCommand      = "command"
)

// rejectedRequest captures a request as received for a rejection entry.
func rejectedRequest(subject string, h nats.Header, data []byte) RejectedRequest {
	rr := RejectedRequest{Subject: subject}
	if len(h) > 0 {
		rr.Headers = map[string][]string(h)
	}
	if len(data) > maxRejectedData {
		data, rr.Truncated = data[:maxRejectedData], true
	}
	switch {
	case len(data) == 0:
	case !rr.Truncated && json.Valid(data):
		rr.Data = compactJSON(data)
	default:
		s := string(data)
		if !utf8.ValidString(s) {
			s = fmt.Sprintf("%q", data)
		}
		b, _ := json.Marshal(s)
		rr.Data = b
	}
	return rr
}

// RejectCommand records a tool command that an executor refused (it did not
// validate, or names a call the ledger never dispatched) as a rejection entry.
func (l *Ledger) RejectCommand(ctx context.Context, subject string, h nats.Header, data []byte, e *Error) error {
	sub, _ := ParseSubject(subject)
	err := l.reject(ctx, OpCommand, sub.Project, sub.Channel, e, rejectedRequest(subject, h, data))
	if e.Seq != 0 {
		return nil
	}
	// Not wrapped: the refusal was not recorded, so callers must retry.
	return fmt.Errorf("record command rejection: %s", err)
}

// reject records e as a rejection entry and returns e with the entry's
// sequence. When the entry cannot be written the returned error says so and
// still wraps e, so callers can branch on the refusal either way.
func (l *Ledger) reject(ctx context.Context, op, project, channel string, e *Error, req RejectedRequest) error {
	l.m.rejections.WithLabelValues(string(e.Code), op).Inc()
	switch e.Code {
	case CodeStaleEpoch:
		l.m.staleEpochs.Inc()
	case CodeConflict:
		l.m.conflicts.Inc()
	}
	data, err := json.Marshal(RejectionEntry{Op: op, Code: e.Code, Message: e.Message, Violations: e.Violations, Request: req})
	if err != nil {
		return fmt.Errorf("encode rejection entry: %v: %w", err, e)
	}
	msg := &nats.Msg{Subject: RejectionSubject(l.version, project, channel, e.Code), Data: data, Header: nats.Header{}}
	if ValidIdentifier(project) {
		msg.Header.Set(HeaderProjectID, project)
	}
	if ValidIdentifier(channel) {
		msg.Header.Set(HeaderChannelID, channel)
	}
	ack, err := l.appendEntry(ctx, KindRejection, msg)
	if err != nil {
		l.log.Error("rejection entry not written", "op", op, "code", e.Code, "err", err)
		return fmt.Errorf("record rejection: %v: %w", err, e)
	}
	e.Seq = ack.Sequence
	l.log.Info("request rejected", "op", op, "code", e.Code, "violations", len(e.Violations), "seq", ack.Sequence)
	return e
}
