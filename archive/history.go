package archive

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/ledger"
)

// History is a ledger's history kept in an archive and a stream: the
// sealed segments up to the archive's last sequence, then the stream.
type History struct {
	Archive *Archive
	JS      jetstream.JetStream
	Stream  string
}

// ReadFrom implements ledger.History.
func (h History) ReadFrom(ctx context.Context, from uint64, fn func(ledger.Entry) error) (uint64, error) {
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
	last, err := ledger.StreamHistory{JS: h.JS, Stream: h.Stream}.ReadFrom(ctx, from, fn)
	if err != nil {
		return 0, err
	}
	return max(last, archived), nil
}
