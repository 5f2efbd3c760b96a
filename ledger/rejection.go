package ledger

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
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

// rejectedRequest captures a request as received for a rejection entry,
// in a form that is always valid JSON and valid UTF-8 (see RejectedRequest).
func rejectedRequest(subject string, h nats.Header, data []byte) RejectedRequest {
	rr := RejectedRequest{Subject: subject}
	rr.Headers, rr.HeadersBase64, rr.Truncated = rejectedHeaders(h)
	valid := utf8.Valid(data)
	if len(data) > maxRejectedData {
		cut := maxRejectedData
		if valid {
			// Cut on a character boundary, so a valid body stays valid.
			for cut > 0 && !utf8.RuneStart(data[cut]) {
				cut--
			}
		}
		data, rr.Truncated = data[:cut], true
	}
	switch {
	case len(data) == 0:
	case !valid:
		rr.DataBase64 = base64.StdEncoding.EncodeToString(data)
	case !rr.Truncated && json.Valid(data):
		rr.Data = compactJSON(data)
	default:
		b, _ := json.Marshal(string(data))
		rr.Data = b
	}
	return rr
}

// rejectedHeaders splits h into headers that are valid UTF-8 and the others,
// base64-encoded, keeping at most maxRejectedHeaders bytes (names in sorted
// order); truncated says when some were left out.
func rejectedHeaders(h nats.Header) (plain, encoded map[string][]string, truncated bool) {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	size := 0
	for _, k := range keys {
		n := 0
		for _, v := range h[k] {
			n += len(k) + len(v) + 4
		}
		if size+n > maxRejectedHeaders {
			truncated = true
			continue
		}
		size += n
		ok := utf8.ValidString(k)
		for _, v := range h[k] {
			ok = ok && utf8.ValidString(v)
		}
		if ok {
			if plain == nil {
				plain = map[string][]string{}
			}
			plain[k] = append([]string(nil), h[k]...)
			continue
		}
		if encoded == nil {
			encoded = map[string][]string{}
		}
		vals := make([]string, len(h[k]))
		for i, v := range h[k] {
			vals[i] = base64.StdEncoding.EncodeToString([]byte(v))
		}
		encoded[base64.StdEncoding.EncodeToString([]byte(k))] = vals
	}
	return plain, encoded, truncated
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
	// An API request came on the subject of one project, which NATS
	// permissions scope: its refusal belongs to that project's views, even
	// when the body names no project (not an object) or another one (a
	// repeated project_id whose last copy names someone else's project,
	// which must not put entries into that project's views).
	if c, ok := CallerFrom(ctx); ok && ValidIdentifier(c.Project) && c.Project != project {
		project, channel = c.Project, Unrouted
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
