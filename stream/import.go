package stream

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ImportConfig tunes ImportVerified. The zero value is usable.
type ImportConfig struct {
	// InFlight bounds the publishes awaiting their acknowledgement; 0 means
	// 1024. Negative is refused (Validate).
	InFlight int
	// Progress, when set, is called after each entry is published, with the
	// number published so far, from the goroutine that publishes (not the
	// caller's).
	Progress func(entries uint64)
	// Verified, when set, is called with each entry once it has verified,
	// before it is published, with the headers the stream then holds: the
	// file's without Nats-*, and the two that make JetStream check the
	// entry's sequence (Nats-Expected-Stream, Nats-Expected-Last-Sequence;
	// the views keep neither). The map is the one published, read on
	// another goroutine: to be read, not changed. A replay projects the
	// entry from there rather than reading it back from the stream. An
	// error stops the import. It is called on the goroutine that called
	// ImportVerified; Progress on another one.
	Verified func(e ExportEntry) error
}

// errStopImport ends the read of the file at the first entry that fails
// verification; the report says which.
var errStopImport = errors.New("stop import")

// ImportVerified reads an export file once: it verifies the chain as it
// reads (as VerifyExport does) and appends each verified entry to the
// empty stream with its original sequence, pipelining the publishes (at most
// InFlight unacknowledged). It stops at the first entry that does not
// verify: the report says which, and the stream holds only entries before
// it. The error is for what is not a verdict on the file (an unreadable
// file, a stream that refuses an entry). JetStream's own Nats-* headers are
// dropped as in Import.
func ImportVerified(ctx context.Context, js jetstream.JetStream, stream string, r io.Reader, cfg ImportConfig) (VerifyReport, error) {
	var rep VerifyReport
	if err := cfg.Validate(); err != nil {
		return rep, fmt.Errorf("import: %w", err)
	}
	inFlight := cfg.InFlight
	if inFlight == 0 {
		inFlight = 1024
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return rep, fmt.Errorf("import: stream %s: %w", stream, err)
	}
	if last := s.CachedInfo().State.LastSeq; last != 0 {
		return rep, fmt.Errorf("import: stream %s is not empty (last seq %d)", stream, last)
	}
	// The file is read and verified here while another goroutine publishes
	// what has verified and waits for the acks: the read (and the views a
	// replay projects from it, Verified) does not stall on the window.
	pub := startImportPublisher(ctx, js, stream, inFlight, cfg.Progress)
	var v *protocol.ChainVerifier
	chunk := make([]importItem, 0, importChunk)
	hdr, tr, err := ReadExport(r, func(h ExportHeader) (err error) {
		if h.FromSeq != 1 {
			return fmt.Errorf("%w: a replay needs a full export (from_seq 1), this one starts at %d", ErrBadExport, h.FromSeq)
		}
		v, err = chainFrom(h)
		return err
	}, func(e ExportEntry) error {
		rep.LastSeq = e.Seq
		rep.Note(e.Seq, e.Subject, nats.Header(e.Headers), e.Data)
		file, _ := protocol.ParseLink(e.Link)
		if !v.Add(e.Seq, e.Subject, nats.Header(e.Headers), e.Data, &file) {
			return errStopImport
		}
		msg := importMsgOwned(e, stream)
		if cfg.Verified != nil {
			stored := e
			stored.Headers = msg.Header
			if err := cfg.Verified(stored); err != nil {
				return err
			}
		}
		chunk = append(chunk, importItem{seq: e.Seq, msg: msg})
		if len(chunk) == importChunk {
			if err := pub.send(chunk); err != nil {
				return err
			}
			chunk = make([]importItem, 0, importChunk)
		}
		return nil
	})
	if err == nil || errors.Is(err, errStopImport) {
		if len(chunk) > 0 {
			err = pub.send(chunk)
		} else {
			err = nil
		}
	}
	// The publisher always finishes (what it was sent, every ack) before
	// this returns: the caller may close the connection next.
	pub.close()
	perr := pub.wait()
	switch {
	case errors.Is(err, errPublisherStopped):
		// The publisher's own error says what went wrong.
		return rep, perr
	case err != nil:
		return rep, err
	case perr != nil:
		return rep, perr
	}
	verdict(&rep, hdr, v, tr, 0)
	return rep, nil
}

// importMsg is the message that stores e again: its subject, data and
// headers, without JetStream's own Nats-* headers (they steer the server,
// a replayed Nats-Msg-Id could be deduplicated away, and the chain does
// not cover them).
func importMsg(e ExportEntry) *nats.Msg {
	return &nats.Msg{Subject: e.Subject, Data: e.Data, Header: ImportedHeaders(e.Headers)}
}

// ImportedHeaders are the headers an import stores of an entry's: all but
// JetStream's own Nats-* headers (see importMsg).
func ImportedHeaders(h map[string][]string) nats.Header {
	out := make(nats.Header, len(h))
	for k, v := range h {
		if !isNatsHeader(k) {
			out[k] = v
		}
	}
	return out
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
