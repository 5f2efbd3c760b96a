package projector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// link returns the chain link the views recorded for seq.
func (s *Store) link(seq uint64) (*protocol.Link, error) {
	v, ok, err := get(s.db, key(tagLink).u64(seq))
	if err != nil || !ok {
		return nil, err
	}
	var l protocol.Link
	copy(l[:], v)
	return &l, nil
}

// LinkAt returns the chain link the views recorded after applying seq, and
// false when they have not applied it (or it is outside the chain).
func (s *Store) LinkAt(seq uint64) (protocol.Link, bool, error) {
	l, err := s.link(seq)
	if err != nil || l == nil {
		return protocol.Link{}, false, err
	}
	return *l, true, nil
}

// LostAt returns the range of entries recorded as lost (a lost row) that
// holds seq, and false when seq is in none.
func (s *Store) LostAt(seq uint64) (first, last uint64, ok bool, err error) {
	p := key(tagLost).prefix()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: key(tagLost).u64(seq + 1)})
	if err != nil {
		return 0, 0, false, fmt.Errorf("projector: lost ranges: %w", err)
	}
	defer it.Close()
	if !it.Last() {
		return 0, 0, false, it.Error()
	}
	if len(it.Value()) != 8 {
		return 0, 0, false, fmt.Errorf("projector: lost row %q has %d bytes", it.Key(), len(it.Value()))
	}
	first, last = trailingU64(it.Key()), binary.BigEndian.Uint64(it.Value())
	if last < seq {
		return 0, 0, false, nil
	}
	return first, last, true, nil
}

// ChainHead returns the applied sequence and the chain link after it.
func (s *Store) ChainHead() (uint64, protocol.Link, error) {
	cp, err := s.checkpoint()
	return cp.Applied, cp.Head, err
}

// VerifyStream recomputes the hash chain from the live ledger stream and
// compares every entry with the link the views recorded when they applied it
// (the views' checkpoints). It names the first sequence that differs: an
// entry changed in the stream after it was projected. Entries the views have
// not applied yet are chained but have nothing to compare with.
func (s *Store) VerifyStream(ctx context.Context, js jetstream.JetStream, name string) (stream.VerifyReport, error) {
	if name == "" {
		name = stream.DefaultName
	}
	return s.VerifyHistory(ctx, stream.JetStreamHistory{JS: js, Stream: name})
}

// VerifyHistory is VerifyStream over a history wherever it is kept (an
// archive and then the stream). History that is kept nowhere any more is
// a failed verification naming the first missing sequence.
func (s *Store) VerifyHistory(ctx context.Context, h stream.History) (stream.VerifyReport, error) {
	v := protocol.NewChainVerifier(1, protocol.Genesis)
	rep := stream.VerifyReport{FromSeq: 1}
	_, err := h.ReadFrom(ctx, 1, func(e protocol.Entry) error {
		want, err := s.link(e.Seq)
		if err != nil {
			return err
		}
		v.Add(e.Seq, e.Subject, nats.Header(e.Headers), e.Data, want)
		rep.LastSeq = e.Seq
		rep.Note(e.Seq, e.Subject, nats.Header(e.Headers), e.Data)
		return nil
	})
	if errors.Is(err, stream.ErrHistoryLost) || errors.Is(err, stream.ErrHistoryCorrupt) {
		rep = finishReport(rep, v)
		rep.OK, rep.FirstBadSeq, rep.Reason = false, rep.LastSeq+1, err.Error()
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("projector: verify stream: %w", err)
	}
	rep = finishReport(rep, v)
	// A stream that ends before the views lost entries the views hold (it
	// was truncated, or replaced by a shorter one): the chain of what is
	// left can be intact, so say so explicitly.
	if applied, err := s.Applied(); err == nil && applied > rep.LastSeq && rep.OK {
		rep.OK = false
		rep.FirstBadSeq = rep.LastSeq + 1
		rep.Reason = fmt.Sprintf("the stream ends at seq %d but the views were built from it up to seq %d: entries are missing", rep.LastSeq, applied)
	}
	return rep, nil
}

// VerifyExport checks an export file on its own (stream.VerifyExport) and
// also against the links these views recorded, so a file whose links were
// all recomputed after an edit still fails at the edited entry.
func (s *Store) VerifyExport(r io.Reader) (stream.VerifyReport, error) {
	rep, err := stream.VerifyExportAgainst(r, s.link)
	if err != nil {
		return rep, fmt.Errorf("projector: verify export: %w", err)
	}
	return rep, nil
}

func finishReport(rep stream.VerifyReport, v *protocol.ChainVerifier) stream.VerifyReport {
	rep.Count, rep.Head = v.Count(), v.Head().String()
	if bad, why := v.FirstBad(); bad != 0 {
		rep.FirstBadSeq, rep.Reason = bad, why
		return rep
	}
	rep.OK = true
	return rep
}
