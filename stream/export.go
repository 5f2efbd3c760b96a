package stream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
		// An entry line as the ledger writes it is read by hand; any
		// other line (the trailer, an escape, another layout) by
		// encoding/json, to the same entry (readExportLine). A line read
		// by hand has no repeated key (its keys are in one order, its
		// header names compared as they are, its payload opaque), so the
		// scan below is only for the others.
		if line > 1 && trailer == nil {
			var e ExportEntry
			if readExportLine(b, &e) {
				if err := fn(e); err != nil {
					return hdr, trailer, err
				}
				continue
			}
		}
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
