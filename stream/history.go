package stream

import (
	"context"
	"errors"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// History is the ledger's entries in sequence order, wherever they are
// kept: the stream alone (JetStreamHistory), or sealed archive segments and
// then the stream (package archive). Exports, verifications and rebuilds
// read through it, so they see one chain from sequence 1 either way.
type History interface {
	// ReadFrom calls fn for every entry from sequence from (1 if 0) to the
	// last sequence as of the call, in order with none missing, and returns
	// that last sequence. An entry kept nowhere any more is an error
	// wrapping ErrHistoryLost, never a silent jump.
	ReadFrom(ctx context.Context, from uint64, fn func(protocol.Entry) error) (uint64, error)
}

// ErrHistoryLost is returned when entries a reader needs are no longer
// kept: they expired from the stream (its retention window) and no archive
// holds them.
var ErrHistoryLost = errors.New("ledger history lost")

// ErrHistoryCorrupt is returned when kept history does not verify: an
// archive segment whose chain, trailer or link to the segment before it
// is wrong (it was edited, truncated or replaced).
var ErrHistoryCorrupt = errors.New("ledger history corrupt")

// JetStreamHistory is the history kept in one ledger stream.
type JetStreamHistory struct {
	JS     jetstream.JetStream
	Stream string
}

// ReadFrom implements History.
func (h JetStreamHistory) ReadFrom(ctx context.Context, from uint64, fn func(protocol.Entry) error) (uint64, error) {
	return Read(ctx, h.JS, h.Stream, from, fn)
}

// LostRange is a range of sequences recorded as lost: they expired from
// the stream before anything archived them. Next is the chain link after
// Last when it was known (NextKnown), so the chain can go on past it.
type LostRange struct {
	First, Last uint64
	Next        protocol.Link
	NextKnown   bool
}

// ChainStart is implemented by a History that can start a read part way
// and still chain it: for seq, the first sequence of the stored piece that
// holds it and the chain link before that piece (an archive segment and
// the link in its header). Exports from a later sequence then read that
// piece on, not the whole history from sequence 1; ok is false when the
// history has no such piece for seq.
type ChainStart interface {
	ChainStart(seq uint64) (start uint64, prev protocol.Link, ok bool, err error)
}
