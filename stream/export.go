package stream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Export file format (docs/tamper-evidence.md): JSON Lines. The first line
// is an ExportHeader, then one ExportEntry per ledger entry in sequence
// order, then an ExportTrailer. The format is versioned and stable across
// releases: this build writes version 2 and reads 1 and 2.
const (
	ExportFormat  = "cgledger.export"
	ExportVersion = 2
)

// exportLine is an entry line as written. Version 2 keeps a payload that is
// compact JSON as JSON ("json"), so a person can read the file, and any
// other bytes as base64 ("data"); version 1 had only "data". Either way the
// reader gets the stored bytes back exactly, which the chain needs.
type exportLine struct {
	Seq     uint64              `json:"seq"`
	Subject string              `json:"subject"`
	Headers map[string][]string `json:"headers,omitempty"`
	JSON    json.RawMessage     `json:"json,omitempty"`
	Data    *[]byte             `json:"data,omitempty"`
	Time    time.Time           `json:"time"`
	Link    string              `json:"link"`
}

// readableJSON reports whether data can be written as JSON and read back as
// the same bytes by any encoder: valid UTF-8 JSON with no insignificant
// whitespace, and none of the characters encoders may escape (<, >, &,
// U+2028, U+2029), since an escaped copy would read back as other bytes.
func readableJSON(data []byte) bool {
	if len(data) == 0 || string(data) == "null" || !utf8.Valid(data) ||
		bytes.ContainsAny(data, "<>&\u2028\u2029") || !json.Valid(data) {
		return false
	}
	var b bytes.Buffer
	if json.Compact(&b, data) != nil {
		return false
	}
	return bytes.Equal(b.Bytes(), data)
}

// MarshalJSON writes the entry line: the payload as JSON when it reads back
// as the same bytes, else as base64.
func (e ExportEntry) MarshalJSON() ([]byte, error) {
	return AppendExportLine(nil, e)
}

// UnmarshalJSON reads an entry line of version 1 or 2.
func (e *ExportEntry) UnmarshalJSON(b []byte) error {
	var el exportLine
	if err := json.Unmarshal(b, &el); err != nil {
		return err
	}
	return el.entry(e)
}

// entry converts the line into the entry it records.
func (el *exportLine) entry(e *ExportEntry) error {
	*e = ExportEntry{Entry: protocol.Entry{Seq: el.Seq, Subject: el.Subject, Headers: el.Headers, Time: el.Time}, Link: el.Link}
	switch {
	case el.JSON != nil && el.Data != nil:
		return errors.New("an entry has either json or data, not both")
	case el.JSON != nil:
		e.Data = el.JSON
	case el.Data != nil:
		e.Data = *el.Data
	}
	return nil
}

// anyLine is any line after the header, decoded once: the trailer when End
// is set, else an entry.
type anyLine struct {
	exportLine
	End     bool   `json:"end"`
	Count   uint64 `json:"count"`
	LastSeq uint64 `json:"last_seq"`
	Head    string `json:"head"`
}

func lineOf(e ExportEntry) exportLine {
	l := exportLine{Seq: e.Seq, Subject: e.Subject, Headers: e.Headers, Time: e.Time, Link: e.Link}
	if readableJSON(e.Data) {
		l.JSON = e.Data
	} else {
		d := e.Data
		if d == nil {
			d = []byte{}
		}
		l.Data = &d
	}
	return l
}

// ExportHeader is the first line of an export file.
type ExportHeader struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	Stream  string `json:"stream"`
	FromSeq uint64 `json:"from_seq"`
	// PrevLink is the chain link of entry FromSeq-1 (Genesis for 1).
	PrevLink string `json:"prev_link"`
}

// ExportEntry is one entry line: the entry and its chain link.
type ExportEntry struct {
	protocol.Entry
	Link string `json:"link"`
}

// ExportTrailer is the last line; without it the file is truncated.
type ExportTrailer struct {
	End     bool   `json:"end"`
	Count   uint64 `json:"count"`
	LastSeq uint64 `json:"last_seq"`
	Head    string `json:"head"`
}

// Read calls fn for every entry of the ledger stream named stream from
// sequence from (1 if 0) to the stream's last sequence when the call
// starts, in order, and returns that last sequence (Ledger.ReadEntries is
// Read of the ledger's own stream; the projector and the verifier read it
// without a Ledger). An entry from from on that the stream no longer keeps
// (its retention window let it go) is an error wrapping ErrHistoryLost,
// never a silent jump.
func Read(ctx context.Context, js jetstream.JetStream, stream string, from uint64, fn func(protocol.Entry) error) (uint64, error) {
	if from == 0 {
		from = 1
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("read stream %s: %w", stream, err)
	}
	st := s.CachedInfo().State
	last := st.LastSeq
	if last < from {
		return last, nil
	}
	lost := func(next uint64, first uint64) error {
		return fmt.Errorf("%w: entries %d to %d are no longer in stream %s (it keeps %d on)", ErrHistoryLost, next, min(first-1, last), stream, first)
	}
	if st.Msgs == 0 {
		// Every entry expired: an ordered consumer would wait for the next.
		return 0, lost(from, last+1)
	}
	// A short inactivity threshold and an explicit delete keep repeated reads
	// (exports, verifications) from piling up consumers against the
	// server's per-stream limit (1000 by default).
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from, InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return 0, fmt.Errorf("read stream %s: consumer: %w", stream, err)
	}
	defer func() {
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = s.DeleteConsumer(dctx, info.Name)
			cancel()
		}
	}()
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return 0, fmt.Errorf("read stream %s: %w", stream, err)
	}
	defer it.Stop()
	// Next takes a timeout (for the stall check below) or a context, not
	// both, and a context with a timeout per entry would cost an
	// allocation and a timer each: a goroutine stops the read on ctx.
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			it.Stop()
		case <-stopped:
		}
	}()
	next := from
	for {
		m, err := it.Next(jetstream.NextMaxWait(readStallCheck))
		if errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			// Nothing arrives: the entries still to read may have expired
			// since the read began.
			info, ierr := s.Info(ctx)
			if ierr != nil {
				return 0, fmt.Errorf("read stream %s: %w", stream, ierr)
			}
			if first := info.State.FirstSeq; first > next || info.State.Msgs == 0 {
				return 0, lost(next, max(first, info.State.LastSeq+1))
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return 0, fmt.Errorf("read stream %s: %w", stream, ctx.Err())
			}
			return 0, fmt.Errorf("read stream %s: %w", stream, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return 0, fmt.Errorf("read stream %s: metadata: %w", stream, err)
		}
		e := protocol.Entry{Seq: meta.Sequence.Stream, Subject: m.Subject(), Headers: map[string][]string(m.Headers()), Data: m.Data(), Time: meta.Timestamp.UTC()}
		if e.Seq != next {
			return 0, lost(next, e.Seq)
		}
		next++
		if err := fn(e); err != nil {
			return 0, err
		}
		if e.Seq >= last {
			return last, nil
		}
	}
}

// readStallCheck is how long a stream read waits for the next entry before
// it checks whether that entry still exists.
const readStallCheck = 2 * time.Second

// Export writes the ledger stream named stream from sequence from (1 if 0)
// to its current last sequence in the export format, without opening a
// Ledger (clients export a running server's ledger with it). The chain is
// computed from sequence 1 so that the header can carry the link before
// from.
func Export(ctx context.Context, js jetstream.JetStream, stream string, w io.Writer, from uint64) (ExportTrailer, error) {
	return ExportHistory(ctx, JetStreamHistory{JS: js, Stream: stream}, stream, w, from)
}

// ExportHistory is Export for a ledger's history wherever it is kept (an
// archive and then the stream): the header names stream, and the chain is
// computed from sequence 1.
func ExportHistory(ctx context.Context, h History, stream string, w io.Writer, from uint64) (ExportTrailer, error) {
	if from == 0 {
		from = 1
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	start, prev := uint64(1), protocol.Genesis
	if cs, ok := h.(ChainStart); ok && from > 1 {
		s, l, ok, err := cs.ChainStart(from)
		if err != nil {
			return ExportTrailer{}, fmt.Errorf("export: %w", err)
		}
		if ok {
			start, prev = s, l
		}
	}
	v := protocol.NewChainVerifier(start, prev)
	tr := ExportTrailer{End: true}
	headerDone := false
	writeHeader := func() error {
		headerDone = true
		return enc.Encode(ExportHeader{Format: ExportFormat, Version: ExportVersion, Stream: stream, FromSeq: from, PrevLink: v.Head().String()})
	}
	var line []byte
	_, err := h.ReadFrom(ctx, start, func(e protocol.Entry) error {
		if e.Seq == from && !headerDone {
			if err := writeHeader(); err != nil {
				return err
			}
		}
		if !v.Add(e.Seq, e.Subject, nats.Header(e.Headers), e.Data, nil) {
			bad, why := v.FirstBad()
			return fmt.Errorf("export: ledger stream broken at seq %d: %s", bad, why)
		}
		if e.Seq < from {
			return nil
		}
		tr.Count++
		tr.LastSeq = e.Seq
		var err error
		if line, err = AppendExportLine(line[:0], ExportEntry{Entry: e, Link: v.Head().String()}); err != nil {
			return err
		}
		line = append(line, '\n')
		_, err = bw.Write(line)
		return err
	})
	if err != nil {
		return tr, fmt.Errorf("export: %w", err)
	}
	if !headerDone {
		if from > v.Next() {
			var vs protocol.Violations
			vs.Add("from_seq", protocol.VInvalidValue, "sequence %d is past the end of the ledger (last seq %d)", from, v.Next()-1)
			return tr, protocol.NewError(protocol.CodeBadRequest, vs, "export from seq %d: past the end of the ledger (last seq %d)", from, v.Next()-1)
		}
		if err := writeHeader(); err != nil {
			return tr, fmt.Errorf("export: %w", err)
		}
	}
	tr.Head = v.Head().String()
	if err := enc.Encode(tr); err != nil {
		return tr, fmt.Errorf("export: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return tr, fmt.Errorf("export: %w", err)
	}
	return tr, nil
}

// lineKeysUnique refuses a line of an export file that repeats a key in
// any object outside an entry's json payload.
func lineKeysUnique(line int, b []byte) error {
	var vs protocol.Violations
	protocol.CheckDuplicateKeys("line", b, &vs, "json")
	if len(vs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: line %d repeats a key (%s): every key must be unique, or readers disagree on which copy counts", ErrBadExport, line, vs[0].Field)
}

// ErrBadExport is returned for export files that cannot be read at all.
var ErrBadExport = errors.New("bad export file")

// ReadExport reads an export file, calling onHeader (if not nil) with its
// header and fn for every entry in order. The trailer is nil when the file
// has none (it was truncated).
func ReadExport(r io.Reader, onHeader func(ExportHeader) error, fn func(ExportEntry) error) (ExportHeader, *ExportTrailer, error) {
	var hdr ExportHeader
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	line := 0
	var trailer *ExportTrailer
	for sc.Scan() {
		line++
		b := sc.Bytes()
		// A repeated key would let the file show one value to a person
		// (or a reader that keeps the first copy) while this reader, which
		// keeps the last, verifies another. An entry's json payload is the
		// stored bytes, whatever they hold, so it is not looked into.
		if err := lineKeysUnique(line, b); err != nil {
			return hdr, nil, err
		}
		if line == 1 {
			if err := json.Unmarshal(b, &hdr); err != nil || hdr.Format != ExportFormat {
				return hdr, nil, fmt.Errorf("%w: line 1 is not a %s header", ErrBadExport, ExportFormat)
			}
			if hdr.Version != 1 && hdr.Version != ExportVersion {
				return hdr, nil, fmt.Errorf("%w: version %d is not supported (this build reads 1 and %d)", ErrBadExport, hdr.Version, ExportVersion)
			}
			if onHeader != nil {
				if err := onHeader(hdr); err != nil {
					return hdr, nil, err
				}
			}
			continue
		}
		if trailer != nil {
			return hdr, trailer, fmt.Errorf("%w: line %d follows the trailer", ErrBadExport, line)
		}
		// One decode per line: replay and verify read every entry of a
		// file, and decoding each line twice was most of their reading.
		var al anyLine
		if err := json.Unmarshal(b, &al); err != nil {
			return hdr, nil, fmt.Errorf("%w: line %d: %v", ErrBadExport, line, err)
		}
		if al.End {
			if al.Seq != 0 || al.Subject != "" || al.Link != "" {
				return hdr, nil, fmt.Errorf("%w: line %d is an entry (seq %d) marked \"end\": only the trailer has end: true", ErrBadExport, line, al.Seq)
			}
			trailer = &ExportTrailer{End: true, Count: al.Count, LastSeq: al.LastSeq, Head: al.Head}
			continue
		}
		if al.Seq == 0 {
			return hdr, nil, fmt.Errorf("%w: line %d is neither an entry (no seq) nor the trailer (no \"end\": true)", ErrBadExport, line)
		}
		var e ExportEntry
		if err := al.entry(&e); err != nil {
			return hdr, nil, fmt.Errorf("%w: line %d: %v", ErrBadExport, line, err)
		}
		if err := fn(e); err != nil {
			return hdr, trailer, err
		}
	}
	if err := sc.Err(); err != nil {
		return hdr, trailer, fmt.Errorf("%w: %v", ErrBadExport, err)
	}
	if line == 0 {
		return hdr, nil, fmt.Errorf("%w: empty file", ErrBadExport)
	}
	return hdr, trailer, nil
}

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
	// Skips names the skip entries (Ledger.Skip) in the range: each is an
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

// importMsg is the message that stores e again: its subject, data and
// headers, without JetStream's own Nats-* headers (they steer the server,
// a replayed Nats-Msg-Id could be deduplicated away, and the chain does
// not cover them).
func importMsg(e ExportEntry) *nats.Msg {
	msg := &nats.Msg{Subject: e.Subject, Data: e.Data, Header: nats.Header{}}
	for k, v := range e.Headers {
		if !strings.HasPrefix(strings.ToLower(k), "nats-") {
			msg.Header[k] = v
		}
	}
	return msg
}

// Import appends the entries of a full export file (from sequence 1) to an
// empty stream, in order, with the same subjects, headers and data, so that
// every entry gets its original sequence. JetStream's own Nats-* headers are
// dropped: they steer the server (a replayed Nats-Msg-Id could be
// deduplicated away) and are not part of the chain.
func Import(ctx context.Context, js jetstream.JetStream, stream string, r io.Reader) (ExportTrailer, error) {
	var tr ExportTrailer
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return tr, fmt.Errorf("import: stream %s: %w", stream, err)
	}
	if last := s.CachedInfo().State.LastSeq; last != 0 {
		return tr, fmt.Errorf("import: stream %s is not empty (last seq %d)", stream, last)
	}
	_, trailer, err := ReadExport(r, func(h ExportHeader) error {
		if h.FromSeq != 1 {
			return fmt.Errorf("%w: a replay needs a full export (from_seq 1), this one starts at %d", ErrBadExport, h.FromSeq)
		}
		return nil
	}, func(e ExportEntry) error {
		ack, err := js.PublishMsg(ctx, importMsg(e), jetstream.WithExpectStream(stream), jetstream.WithExpectLastSequence(e.Seq-1))
		if err != nil {
			return fmt.Errorf("import: entry %d: %w", e.Seq, err)
		}
		if ack.Sequence != e.Seq {
			return fmt.Errorf("import: entry %d was stored as %d", e.Seq, ack.Sequence)
		}
		tr.Count++
		tr.LastSeq = e.Seq
		return nil
	})
	if err != nil {
		return tr, err
	}
	if trailer == nil {
		return tr, fmt.Errorf("%w: truncated (no trailer)", ErrBadExport)
	}
	tr.End, tr.Head = true, trailer.Head
	return tr, nil
}
