package ledger

import (
	"context"
	"io"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// ReadEntries calls fn for every entry of the ledger stream from sequence
// from to the stream's last sequence when the call starts, in order
// (stream.Read of the ledger's stream).
func (l *Ledger) ReadEntries(ctx context.Context, from uint64, fn func(protocol.Entry) error) (last uint64, err error) {
	return stream.Read(ctx, l.js, l.streams.Stream, from, fn)
}

// Export writes the ledger from sequence from (1 if 0) to its current last
// sequence in the export format (stream.Export of the ledger's stream).
func (l *Ledger) Export(ctx context.Context, w io.Writer, from uint64) (stream.ExportTrailer, error) {
	return stream.Export(ctx, l.js, l.streams.Stream, w, from)
}
