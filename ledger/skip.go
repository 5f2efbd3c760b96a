package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Skip appends a skip entry for sequence seq: the audited operator decision
// that the projector, which stops on an entry it cannot apply, records that
// entry as skipped and goes on (docs/views.md, "Operator recovery"). It
// writes at most one skip per sequence: repeating the same skip answers the
// existing one with Duplicate set; a skip with another reason is a conflict.
// A sequence past the end of the ledger is a bad request: there is nothing
// there to skip, and a skip written ahead would silently apply to whatever
// arrives later.
func (l *Ledger) Skip(ctx context.Context, seq uint64, reason string) (protocol.SkipResult, error) {
	return l.skip(ctx, callerOf(ctx), seq, reason)
}

// skip is Skip for by, the caller (an admin) whose request writes it.
func (l *Ledger) skip(ctx context.Context, by *protocol.Caller, seq uint64, reason string) (protocol.SkipResult, error) {
	var vs protocol.Violations
	switch {
	case strings.TrimSpace(reason) == "":
		vs.Add("reason", protocol.VRequired, "a skip needs a reason: it is the audit trail of the decision")
	case len(reason) > protocol.MaxSkipReason:
		vs.Add("reason", protocol.VTooLarge, "is %d bytes, at most %d", len(reason), protocol.MaxSkipReason)
	case !utf8.ValidString(reason):
		vs.Add("reason", protocol.VInvalidValue, "must be UTF-8")
	}
	if seq == 0 {
		vs.Add("seq", protocol.VInvalidValue, "must be at least 1")
	}
	if err := protocol.BadRequest("skip", vs); err != nil {
		return protocol.SkipResult{}, err
	}
	info, err := l.stream.Info(ctx)
	if err != nil {
		return protocol.SkipResult{}, fmt.Errorf("skip seq %d: stream info: %w", seq, err)
	}
	if last := info.State.LastSeq; seq > last {
		vs.Add("seq", protocol.VInvalidValue, "sequence %d is past the end of the ledger (last seq %d)", seq, last)
		return protocol.SkipResult{}, protocol.BadRequest("skip", vs)
	}
	e := protocol.SkipEntry{Seq: seq, Reason: reason}
	if m, err := l.stream.GetMsg(ctx, seq); err == nil {
		e.Subject = m.Subject
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return protocol.SkipResult{}, fmt.Errorf("skip seq %d: read the entry: %w", seq, err)
	}
	data, err := json.Marshal(e)
	if err != nil {
		return protocol.SkipResult{}, fmt.Errorf("skip seq %d: encode: %w", seq, err)
	}
	subject := protocol.SkipSubject(l.version, seq)
	// Publishing only while the subject's last sequence is as read makes
	// concurrent skips of one sequence write one entry; a loser re-reads and
	// answers duplicate or conflict. The loop ends because every retry
	// follows a message appended by someone else.
	for attempt := 0; ; attempt++ {
		// Read the subject's last sequence before looking for a skip: a
		// skip appended after this read makes the publish below fail (and
		// this loop look again), where reading it after the search could
		// expect that very skip as "last" and write a second one.
		// Messages on the subject that are not valid skips (published by
		// others) must not block the operator: expect the subject's last
		// sequence as it is rather than 0.
		var lastOnSubject uint64
		if m, err := l.lastForSubject(ctx, subject); err != nil {
			return protocol.SkipResult{}, fmt.Errorf("skip seq %d: %w", seq, err)
		} else if m != nil {
			lastOnSubject = m.Sequence
		}
		existing, found, err := stream.FindSkip(ctx, l.stream, seq)
		if err != nil {
			return protocol.SkipResult{}, fmt.Errorf("skip seq %d: %w", seq, err)
		}
		if found {
			res := protocol.SkipResult{Seq: seq, SkipSeq: existing.SkipSeq, Reason: existing.Reason, Subject: existing.Subject, Duplicate: true}
			if existing.Reason == reason {
				return res, nil
			}
			return res, protocol.NewError(protocol.CodeConflict, nil, "sequence %d is already skipped by entry %d with reason %q", seq, existing.SkipSeq, protocol.Clip(existing.Reason))
		}
		msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
		ack, err := l.appendEntry(ctx, by, protocol.KindSkip, msg, jetstream.WithExpectLastSequencePerSubject(lastOnSubject))
		if isWrongLastSeq(err) && attempt < 100 {
			continue
		}
		if err != nil {
			return protocol.SkipResult{}, fmt.Errorf("skip seq %d: append: %w", seq, err)
		}
		return protocol.SkipResult{Seq: seq, SkipSeq: ack.Sequence, Reason: reason, Subject: e.Subject}, nil
	}
}
