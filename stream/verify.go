package stream

import (
	"fmt"
	"io"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
)

// VerifyReport is the result of verifying a chain.
type VerifyReport struct {
	FromSeq uint64 `json:"from_seq"`
	Count   uint64 `json:"count"`
	LastSeq uint64 `json:"last_seq"`
	Head    string `json:"head"`
	OK      bool   `json:"ok"`
	// FirstBadSeq is the first sequence that does not match, 0 when OK.
	FirstBadSeq uint64 `json:"first_bad_seq,omitempty"`
	Reason      string `json:"reason,omitempty"`
	// Unrecognized names the chained messages that are not ledger entries
	// (RecognizeEntry): the projector records them as unrecognized and goes
	// on, so they do not fail verification. At most MaxNoted are listed;
	// UnrecognizedCount counts them all.
	Unrecognized      []NotedEntry `json:"unrecognized,omitempty"`
	UnrecognizedCount uint64       `json:"unrecognized_count,omitempty"`
	// Skips names the skip entries (ledger.Ledger.Skip) in the range: each is an
	// operator's decision that the projector records the entry it names as
	// skipped. At most MaxNoted are listed; SkipCount counts them all.
	Skips     []NotedSkip `json:"skips,omitempty"`
	SkipCount uint64      `json:"skip_count,omitempty"`
}

// MaxNoted bounds the entries a VerifyReport lists by name, so a flood of
// stray messages cannot make the report unbounded.
const MaxNoted = 1000

// NotedEntry is an unrecognized entry named in a VerifyReport.
type NotedEntry struct {
	Seq     uint64 `json:"seq"`
	Subject string `json:"subject"`
	Code    string `json:"code"`
	Reason  string `json:"reason"`
}

// NotedSkip is a skip entry named in a VerifyReport.
type NotedSkip struct {
	// Seq is the skipped sequence; SkipSeq the skip entry's own.
	Seq     uint64 `json:"seq"`
	SkipSeq uint64 `json:"skip_seq"`
	Reason  string `json:"reason"`
}

// Note records entry seq in the report when it is unrecognized or a skip
// entry. Both verifiers call it for every entry they chain.
func (r *VerifyReport) Note(seq uint64, subject string, h nats.Header, data []byte) {
	// Read as the views read it: header names case-insensitively.
	h = nats.Header(protocol.CanonicalHeaders(h))
	rec := protocol.RecognizeEntry(subject, h)
	switch {
	case rec.Unrecognized():
		r.UnrecognizedCount++
		if len(r.Unrecognized) < MaxNoted {
			r.Unrecognized = append(r.Unrecognized, NotedEntry{Seq: seq, Subject: protocol.Clip(subject), Code: rec.Code, Reason: rec.Reason})
		}
	case rec.Kind == string(protocol.KindSkip):
		sub, err := protocol.ParseSubject(subject)
		if err != nil {
			return
		}
		if s, ok := protocol.ParseSkip(seq, subject, h, data, sub.Seq); ok {
			r.SkipCount++
			if len(r.Skips) < MaxNoted {
				r.Skips = append(r.Skips, NotedSkip{Seq: s.Seq, SkipSeq: seq, Reason: s.Reason})
			}
		}
	}
}

// VerifyExport recomputes the hash chain of an export file and compares each
// entry with the link recorded for it, naming the first sequence that does
// not match. A missing trailer or a trailer that disagrees fails too.
func VerifyExport(r io.Reader) (VerifyReport, error) {
	return VerifyExportAgainst(r, nil)
}

// VerifyExportAgainst is VerifyExport that also compares every entry with a
// reference link (ref returns nil when it has none), such as the links a
// projector recorded: a file whose links were all recomputed after an edit
// is self-consistent, but fails against the reference at the edited entry.
func VerifyExportAgainst(r io.Reader, ref func(seq uint64) (*protocol.Link, error)) (VerifyReport, error) {
	var v *protocol.ChainVerifier
	var rep VerifyReport
	var fileBad uint64
	hdr, tr, err := ReadExport(r, func(h ExportHeader) (err error) {
		v, err = chainFrom(h)
		return err
	}, func(e ExportEntry) error {
		rep.LastSeq = e.Seq
		rep.Note(e.Seq, e.Subject, nats.Header(e.Headers), e.Data)
		// An unparseable link cannot match any recomputed one.
		file, _ := protocol.ParseLink(e.Link)
		if ref == nil {
			v.Add(e.Seq, e.Subject, nats.Header(e.Headers), e.Data, &file)
			return nil
		}
		want, err := ref(e.Seq)
		if err != nil {
			return err
		}
		if v.Add(e.Seq, e.Subject, nats.Header(e.Headers), e.Data, want) && fileBad == 0 && file != v.Head() {
			fileBad = e.Seq
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	verdict(&rep, hdr, v, tr, fileBad)
	return rep, nil
}

// chainFrom starts verifying the chain of the file whose header is h.
func chainFrom(h ExportHeader) (*protocol.ChainVerifier, error) {
	prev, err := protocol.ParseLink(h.PrevLink)
	if err != nil {
		return nil, fmt.Errorf("%w: header prev_link: %v", ErrBadExport, err)
	}
	return protocol.NewChainVerifier(h.FromSeq, prev), nil
}

// verdict completes rep from the verifier of a file read to its end: the
// first bad entry (by the chain, then by fileBad, a mismatch with a
// reference), a missing trailer, or a trailer that disagrees.
func verdict(rep *VerifyReport, hdr ExportHeader, v *protocol.ChainVerifier, tr *ExportTrailer, fileBad uint64) {
	rep.FromSeq = hdr.FromSeq
	rep.Count, rep.Head = v.Count(), v.Head().String()
	switch bad, why := v.FirstBad(); {
	case bad != 0:
		rep.FirstBadSeq, rep.Reason = bad, why
	case fileBad != 0:
		rep.FirstBadSeq, rep.Reason = fileBad, fmt.Sprintf("entry %d does not match the link recorded in the file", fileBad)
	case tr == nil:
		rep.FirstBadSeq, rep.Reason = v.Next(), "file is truncated: no trailer"
	case tr.Count != v.Count() || tr.Head != rep.Head || (tr.Count > 0 && tr.LastSeq != v.Next()-1):
		rep.FirstBadSeq, rep.Reason = v.Next(), fmt.Sprintf("trailer says %d entries ending at seq %d in %s; file holds %d ending at seq %d in %s", tr.Count, tr.LastSeq, tr.Head, v.Count(), v.Next()-1, rep.Head)
	default:
		rep.OK = true
	}
}
