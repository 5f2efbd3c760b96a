package archive

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// History is a ledger's history kept in an archive and a stream: the
// sealed segments up to the archive's last sequence, then the stream.
type History struct {
	Archive *Archive
	JS      jetstream.JetStream
	Stream  string
}

// ReadFrom implements stream.History.
func (h History) ReadFrom(ctx context.Context, from uint64, fn func(protocol.Entry) error) (uint64, error) {
	if from == 0 {
		from = 1
	}
	archived, _, err := h.Archive.Last()
	if err != nil {
		return 0, err
	}
	if from <= archived {
		if err := h.Archive.ReadRange(ctx, from, archived, fn); err != nil {
			return 0, err
		}
		from = archived + 1
	}
	last, err := stream.JetStreamHistory{JS: h.JS, Stream: h.Stream}.ReadFrom(ctx, from, fn)
	if err != nil {
		return 0, err
	}
	return max(last, archived), nil
}

// ChainStart implements stream.ChainStart: the archive segment holding
// seq and the link in its header, or, past the archive, the stream from
// after the archive's last entry and the archive's head.
func (h History) ChainStart(seq uint64) (uint64, protocol.Link, bool, error) {
	archived, head, err := h.Archive.Last()
	if err != nil {
		return 0, protocol.Link{}, false, err
	}
	if seq > archived {
		// The stream holds what follows the archive, unless a recorded
		// loss comes first: the read starts after it, chained from the
		// link its marker carries, when seq is past it.
		start, prev := archived+1, head
		for {
			r, lost, err := h.Archive.LostAt(start)
			if err != nil {
				return 0, protocol.Link{}, false, err
			}
			if !lost {
				return start, prev, true, nil
			}
			if r.Last >= seq {
				return 0, protocol.Link{}, false, nil
			}
			// Past a loss whose next link nobody knew, the chain starts
			// again from the zero link, as the views' does.
			start, prev = r.Last+1, protocol.Link{}
			if r.NextKnown {
				prev = r.Next
			}
		}
	}
	segs, err := h.Archive.Segments()
	if err != nil {
		return 0, protocol.Link{}, false, err
	}
	for _, s := range segs {
		if s.First <= seq && seq <= s.Last {
			hdr, err := readHeader(s.Path)
			if err != nil {
				return 0, protocol.Link{}, false, err
			}
			prev, err := protocol.ParseLink(hdr.PrevLink)
			if err != nil || hdr.FromSeq != s.First {
				return 0, protocol.Link{}, false, fmt.Errorf("%w: %s: header", ErrBadSegment, s.Path)
			}
			return s.First, prev, true, nil
		}
	}
	return 0, protocol.Link{}, false, nil
}
