package projector

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
)

// UnrecognizedEntry is a stream message the projector recorded as
// unrecognized: not a ledger entry it can interpret.
type UnrecognizedEntry struct {
	Seq uint64 `json:"seq"`
	// Time is the message's CG-Time when it has a valid one (zero otherwise).
	// It is what the message claims, so it never moves the views' time
	// watermark.
	Time    time.Time           `json:"time"`
	Subject string              `json:"subject"`
	Headers map[string][]string `json:"headers,omitempty"`
	// Code is a stable protocol.Unrecognized* code; Reason explains it.
	Code   string `json:"code"`
	Reason string `json:"reason"`
}

// SkippedEntry is an entry the projector recorded as skipped because a skip
// entry named it.
type SkippedEntry struct {
	Seq     uint64              `json:"seq"`
	Time    time.Time           `json:"time"`
	Subject string              `json:"subject"`
	Headers map[string][]string `json:"headers,omitempty"`
	// SkipSeq is the skip entry's sequence and Reason the operator's reason.
	SkipSeq uint64 `json:"skip_seq"`
	Reason  string `json:"reason"`
}

// SkipItem is a valid skip entry (protocol.ParseSkip).
type SkipItem struct {
	// Seq is the skip entry's sequence; SkippedSeq the entry it names.
	Seq        uint64    `json:"seq"`
	Time       time.Time `json:"time"`
	SkippedSeq uint64    `json:"skipped_seq"`
	Reason     string    `json:"reason"`
	// Effective says the named entry was recorded as skipped by this skip
	// entry; false when that entry applied normally, or another skip came
	// first.
	Effective bool `json:"effective"`
}

// listSeqRows pages through rows tag\0<seq> at or before the view's
// sequence, after the cursor, calling fn for each.
func (q *Queries) listSeqRows(tag string, at AsOf, cursor string, limit int, fn func(v *view, seq uint64, val []byte) error) (uint64, string, error) {
	v, err := q.open(at)
	if err != nil {
		return 0, "", err
	}
	defer v.close()
	limit = clampLimit(limit)
	after, err := decodeSeqCursor(cursor, tag)
	if err != nil {
		return 0, "", err
	}
	p := key(tag).prefix()
	lower := key(tag).u64(after + 1)
	var n int
	var last uint64
	var next string
	err = scan(v.snap, p, lower, func(k, val []byte) (bool, error) {
		seq := trailingU64(k)
		if seq > v.seq {
			return false, nil
		}
		if n == limit {
			next = encodeSeqCursor(tag, last)
			return false, nil
		}
		n, last = n+1, seq
		return true, fn(v, seq, val)
	})
	return v.seq, next, err
}

// Unrecognized lists the unrecognized entries in ledger order.
func (q *Queries) Unrecognized(at AsOf, cursor string, limit int) (*Page[UnrecognizedEntry], error) {
	out := &Page[UnrecognizedEntry]{Items: []UnrecognizedEntry{}}
	seq, next, err := q.listSeqRows(tagUnrec, at, cursor, limit, func(v *view, seq uint64, val []byte) error {
		it, err := v.item(seq)
		if err != nil {
			return err
		}
		out.Items = append(out.Items, UnrecognizedEntry{Seq: seq, Time: it.Time, Subject: it.Subject, Headers: it.Headers, Code: string(val), Reason: it.Reason})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: unrecognized entries: %w", err)
	}
	out.AsOfSeq, out.NextCursor = seq, next
	return out, nil
}

// Skipped lists the entries recorded as skipped, in ledger order.
func (q *Queries) Skipped(at AsOf, cursor string, limit int) (*Page[SkippedEntry], error) {
	out := &Page[SkippedEntry]{Items: []SkippedEntry{}}
	seq, next, err := q.listSeqRows(tagSkipped, at, cursor, limit, func(v *view, seq uint64, val []byte) error {
		it, err := v.item(seq)
		if err != nil {
			return err
		}
		out.Items = append(out.Items, SkippedEntry{Seq: seq, Time: it.Time, Subject: it.Subject, Headers: it.Headers, SkipSeq: it.SkipSeq, Reason: it.Reason})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: skipped entries: %w", err)
	}
	out.AsOfSeq, out.NextCursor = seq, next
	return out, nil
}

// Skips lists the valid skip entries, in ledger order.
func (q *Queries) Skips(at AsOf, cursor string, limit int) (*Page[SkipItem], error) {
	out := &Page[SkipItem]{Items: []SkipItem{}}
	seq, next, err := q.listSeqRows(tagSkip, at, cursor, limit, func(v *view, seq uint64, val []byte) error {
		if len(val) < 8 {
			return fmt.Errorf("skip row %d has %d bytes", seq, len(val))
		}
		it, err := v.item(seq)
		if err != nil {
			return err
		}
		s := SkipItem{Seq: seq, Time: it.Time, SkippedSeq: binary.BigEndian.Uint64(val), Reason: string(val[8:])}
		by, ok, err := get(v.snap, key(tagSkipped).u64(s.SkippedSeq))
		if err != nil {
			return err
		}
		s.Effective = ok && len(by) >= 8 && binary.BigEndian.Uint64(by) == seq
		out.Items = append(out.Items, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projector: skip entries: %w", err)
	}
	out.AsOfSeq, out.NextCursor = seq, next
	return out, nil
}

// annotate adds to a timeline item of an entry the projector did not apply
// why it did not: the reason it is unrecognized (recomputed from the stored
// entry, so a reworded reason needs no rebuild), or the skip that passed it.
func (v *view) annotate(it *TimelineItem, se storedEntry) error {
	switch it.Kind {
	case KindUnrecognized:
		it.Reason = protocol.RecognizeEntry(se.Subject, nats.Header(se.Headers)).Reason
	case KindSkipped:
		row, ok, err := get(v.snap, key(tagSkipped).u64(it.Seq))
		if err != nil {
			return err
		}
		if ok && len(row) >= 8 {
			it.SkipSeq, it.Reason = binary.BigEndian.Uint64(row), string(row[8:])
		}
	}
	return nil
}
