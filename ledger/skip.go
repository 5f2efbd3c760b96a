package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxSkipReason bounds a skip entry's reason, in bytes.
const MaxSkipReason = 1024

// SkipResult is the outcome of Ledger.Skip.
type SkipResult struct {
	// Seq is the skipped sequence.
	Seq uint64 `json:"seq"`
	// SkipSeq is the sequence of the skip entry (the existing one when
	// Duplicate).
	SkipSeq uint64 `json:"skip_seq"`
	Reason  string `json:"reason"`
	// Subject is the skipped entry's subject, as recorded in the skip entry.
	Subject string `json:"subject,omitempty"`
	// Duplicate says an identical skip (same seq and reason) already existed
	// and nothing was appended.
	Duplicate bool `json:"duplicate,omitempty"`
}

// SkipRecord is a skip entry found in the stream.
type SkipRecord struct {
	SkipEntry
	// SkipSeq is the skip entry's own sequence.
	SkipSeq uint64 `json:"skip_seq"`
	// Time is the skip entry's CG-Time (zero when it has none).
	Time time.Time `json:"time"`
}

// Skip appends a skip entry for sequence seq: the audited operator decision
// that the projector, which stops on an entry it cannot apply, records that
// entry as skipped and goes on (docs/views.md, "Operator recovery"). It
// writes at most one skip per sequence: repeating the same skip answers the
// existing one with Duplicate set; a skip with another reason is a conflict.
// A sequence past the end of the ledger is a bad request: there is nothing
// there to skip, and a skip written ahead would silently apply to whatever
// arrives later.
func (l *Ledger) Skip(ctx context.Context, seq uint64, reason string) (SkipResult, error) {
	var vs Violations
	switch {
	case strings.TrimSpace(reason) == "":
		vs.Add("reason", VRequired, "a skip needs a reason: it is the audit trail of the decision")
	case len(reason) > MaxSkipReason:
		vs.Add("reason", VTooLarge, "is %d bytes, at most %d", len(reason), MaxSkipReason)
	case !utf8.ValidString(reason):
		vs.Add("reason", VInvalidValue, "must be UTF-8")
	}
	if seq == 0 {
		vs.Add("seq", VInvalidValue, "must be at least 1")
	}
	if err := badRequest("skip", vs); err != nil {
		return SkipResult{}, err
	}
	info, err := l.stream.Info(ctx)
	if err != nil {
		return SkipResult{}, fmt.Errorf("skip seq %d: stream info: %w", seq, err)
	}
	if last := info.State.LastSeq; seq > last {
		vs.Add("seq", VInvalidValue, "sequence %d is past the end of the ledger (last seq %d)", seq, last)
		return SkipResult{}, badRequest("skip", vs)
	}
	e := SkipEntry{Seq: seq, Reason: reason}
	if m, err := l.stream.GetMsg(ctx, seq); err == nil {
		e.Subject = m.Subject
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return SkipResult{}, fmt.Errorf("skip seq %d: read the entry: %w", seq, err)
	}
	data, err := json.Marshal(e)
	if err != nil {
		return SkipResult{}, fmt.Errorf("skip seq %d: encode: %w", seq, err)
	}
	subject := SkipSubject(l.version, seq)
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
			return SkipResult{}, fmt.Errorf("skip seq %d: %w", seq, err)
		} else if m != nil {
			lastOnSubject = m.Sequence
		}
		existing, found, err := FindSkip(ctx, l.stream, seq)
		if err != nil {
			return SkipResult{}, fmt.Errorf("skip seq %d: %w", seq, err)
		}
		if found {
			res := SkipResult{Seq: seq, SkipSeq: existing.SkipSeq, Reason: existing.Reason, Subject: existing.Subject, Duplicate: true}
			if existing.Reason == reason {
				return res, nil
			}
			return res, newError(CodeConflict, nil, "sequence %d is already skipped by entry %d with reason %q", seq, existing.SkipSeq, clip(existing.Reason))
		}
		msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
		ack, err := l.appendEntry(ctx, KindSkip, msg, jetstream.WithExpectLastSequencePerSubject(lastOnSubject))
		if isWrongLastSeq(err) && attempt < 100 {
			continue
		}
		if err != nil {
			return SkipResult{}, fmt.Errorf("skip seq %d: append: %w", seq, err)
		}
		return SkipResult{Seq: seq, SkipSeq: ack.Sequence, Reason: reason, Subject: e.Subject}, nil
	}
}

// skipFilter matches the skip subjects of seq in every protocol version, so
// a projector finds a skip whatever version the ledger that wrote it used.
func skipFilter(seq uint64) string {
	return Root + ".*." + Unrouted + "." + Unrouted + ".ledger.skip." + strconv.FormatUint(seq, 10)
}

// FindSkip returns the first valid skip entry for seq in the ledger stream
// s (ParseSkip), reading only the messages on seq's skip subjects. The first
// valid one, not the last, is the skip: the stream is append-only, so the
// answer never changes once there is one, and a rebuild or a replay of an
// export finds the same skip as the live projector did.
func FindSkip(ctx context.Context, s jetstream.Stream, seq uint64) (SkipRecord, bool, error) {
	filter := skipFilter(seq)
	for from := seq + 1; ; {
		m, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return SkipRecord{}, false, nil
		}
		if err != nil {
			return SkipRecord{}, false, fmt.Errorf("find skip of seq %d: %w", seq, err)
		}
		if rec, ok := ParseSkip(m.Sequence, m.Subject, m.Header, m.Data, seq); ok {
			return rec, true, nil
		}
		from = m.Sequence + 1
	}
}

// ParseSkip reads the stream message at msgSeq as a skip of seq. It is valid
// when it is a skip entry (RecognizeEntry), on seq's skip subject, after seq,
// and its data names seq with a non-empty reason. Anything else is not a
// skip of seq, so a stray publish can neither skip an entry nor stop
// another skip from working.
func ParseSkip(msgSeq uint64, subject string, h nats.Header, data []byte, seq uint64) (SkipRecord, bool) {
	if msgSeq <= seq || RecognizeEntry(subject, h).Kind != string(KindSkip) {
		return SkipRecord{}, false
	}
	sub, err := ParseSubject(subject)
	if err != nil || sub.Seq != seq {
		return SkipRecord{}, false
	}
	var e SkipEntry
	if err := json.Unmarshal(data, &e); err != nil || e.Seq != seq || strings.TrimSpace(e.Reason) == "" {
		return SkipRecord{}, false
	}
	t, _ := EntryTime(h)
	return SkipRecord{SkipEntry: e, SkipSeq: msgSeq, Time: t}, true
}
