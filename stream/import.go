package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

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
	// number published so far.
	Progress func(entries uint64)
	// Verified, when set, is called with each entry once it has verified,
	// before it is published, with the headers the import stores (without
	// Nats-*; the map is the one published, to be read, not changed): a
	// replay projects it from there rather than reading it back from the
	// stream. An error stops the import.
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
	type pending struct {
		seq uint64
		ack jetstream.PubAckFuture
	}
	var window []pending
	// settle waits for the oldest publishes until at most keep remain.
	settle := func(keep int) error {
		for len(window) > keep {
			p := window[0]
			select {
			case ack := <-p.ack.Ok():
				if ack.Sequence != p.seq {
					return fmt.Errorf("import: entry %d was stored as %d", p.seq, ack.Sequence)
				}
			case err := <-p.ack.Err():
				return fmt.Errorf("import: entry %d: %w", p.seq, err)
			case <-ctx.Done():
				return fmt.Errorf("import: %w", ctx.Err())
			}
			window = window[1:]
		}
		return nil
	}
	var v *protocol.ChainVerifier
	var published uint64
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
		msg := importMsg(e)
		if cfg.Verified != nil {
			stored := e
			stored.Headers = msg.Header
			if err := cfg.Verified(stored); err != nil {
				return err
			}
		}
		// Each publish states the sequence it must get: JetStream refuses it
		// (and so every later one) if anything else was stored between.
		ack, err := js.PublishMsgAsync(msg, jetstream.WithExpectStream(stream), jetstream.WithExpectLastSequence(e.Seq-1))
		if err != nil {
			return fmt.Errorf("import: entry %d: %w", e.Seq, err)
		}
		window = append(window, pending{seq: e.Seq, ack: ack})
		if err := settle(inFlight - 1); err != nil {
			return err
		}
		published++
		if cfg.Progress != nil {
			cfg.Progress(published)
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStopImport) {
		return rep, err
	}
	if err := settle(0); err != nil {
		return rep, err
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
		if !strings.HasPrefix(strings.ToLower(k), "nats-") {
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
