package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
)

// RejectCommand records a tool command that an executor refused (it did not
// validate, or names a call the ledger never dispatched) as a rejection entry.
// A command refused again (redelivered because its ack was lost after the
// entry was written) is recorded once: e.Seq is then the first entry's.
func (l *Ledger) RejectCommand(ctx context.Context, subject string, h nats.Header, data []byte, e *protocol.Error) error {
	_, err := l.rejectCommand(ctx, callerOf(ctx), subject, h, data, e)
	return err
}

// rejectCommand is RejectCommand that also tells whether the command's
// rejection was already on record.
func (l *Ledger) rejectCommand(ctx context.Context, by *protocol.Caller, subject string, h nats.Header, data []byte, e *protocol.Error) (bool, error) {
	sub, _ := protocol.ParseSubject(subject)
	dup, err := l.recordRejection(ctx, by, protocol.OpCommand, sub.Project, sub.Channel, e, protocol.NewRejectedRequest(subject, h, data), commandRejectionID(subject, h, data))
	if e.Seq != 0 {
		return dup, nil
	}
	// Not wrapped: the refusal was not recorded, so callers must retry.
	return false, fmt.Errorf("record command rejection: %s", err)
}

// commandRejectionID is the Nats-Msg-Id of a command's rejection entry: a
// digest of the command as delivered (subject, headers, body), which every
// redelivery repeats, so the stream keeps one rejection per command within
// its duplicate window whoever refuses it. The refusal itself is left out:
// it is the same command either way.
func commandRejectionID(subject string, h nats.Header, data []byte) string {
	// Header names in lower case: a client may send them in any case
	// (docs/protocol.md), and it is still the same command.
	var names map[string][]string
	if len(h) > 0 {
		names = make(map[string][]string, len(h))
		for k, v := range h {
			lk := strings.ToLower(k)
			names[lk] = append(names[lk], v...)
		}
	}
	// encoding/json writes map keys sorted, so header order does not count.
	b, _ := json.Marshal([]any{subject, names, data})
	sum := sha256.Sum256(b)
	return "reject.command." + hex.EncodeToString(sum[:16])
}

// reject records e as a rejection entry and returns e with the entry's
// sequence. When the entry cannot be written the returned error says so and
// still wraps e, so callers can branch on the refusal either way.
func (l *Ledger) reject(ctx context.Context, by *protocol.Caller, op, project, channel string, e *protocol.Error, req protocol.RejectedRequest) error {
	_, err := l.recordRejection(ctx, by, op, project, channel, e, req, "")
	return err
}

// recordRejection is reject with a Nats-Msg-Id (none when msgID is empty),
// reporting whether the stream already held that id's entry (e.Seq is then
// the stored entry's).
func (l *Ledger) recordRejection(ctx context.Context, by *protocol.Caller, op, project, channel string, e *protocol.Error, req protocol.RejectedRequest, msgID string) (bool, error) {
	l.m.rejections.WithLabelValues(string(e.Code), op).Inc()
	// An API request came on the subject of one project, which NATS
	// permissions scope: its refusal belongs to that project's views, even
	// when the body names no project (not an object) or another one (a
	// repeated project_id whose last copy names someone else's project,
	// which must not put entries into that project's views).
	if by != nil && protocol.ValidIdentifier(by.Project) && by.Project != project {
		project, channel = by.Project, protocol.Unrouted
	}
	// A forbidden request is one whose credential is not entitled to what
	// it names, so no channel it names (or its call's) is trusted to file
	// it under: every forbidden refusal is recorded under _._, with its
	// API subject's project in CG-Project-Id, whatever check refused it.
	// (A tool command refused with that code is not a request: it keeps
	// its own subject's project and channel.)
	if e.Code == protocol.CodeForbidden && op != protocol.OpCommand {
		channel = protocol.Unrouted
	}
	data, err := json.Marshal(protocol.RejectionEntry{Op: op, Code: e.Code, Message: e.Message, Violations: e.Violations, Request: req})
	if err != nil {
		return false, fmt.Errorf("encode rejection entry: %v: %w", err, e)
	}
	msg := &nats.Msg{Subject: protocol.RejectionSubject(l.version, project, channel, e.Code), Data: data, Header: nats.Header{}}
	if protocol.ValidIdentifier(project) {
		msg.Header.Set(protocol.HeaderProjectID, project)
	}
	if protocol.ValidIdentifier(channel) {
		msg.Header.Set(protocol.HeaderChannelID, channel)
	}
	if msgID != "" {
		msg.Header.Set(protocol.HeaderMsgID, msgID)
	}
	ack, err := l.appendEntry(ctx, by, protocol.KindRejection, msg)
	if err != nil {
		l.log.Error("rejection entry not written", "op", op, "code", e.Code, "err", err)
		return false, fmt.Errorf("record rejection: %v: %w", err, e)
	}
	e.Seq = ack.Sequence
	l.log.Info("request rejected", "op", op, "code", e.Code, "violations", len(e.Violations), "seq", ack.Sequence, "duplicate", ack.Duplicate)
	return ack.Duplicate, e
}
