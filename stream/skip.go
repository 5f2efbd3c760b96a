package stream

import (
	"context"
	"errors"
	"fmt"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// FindSkip returns the first valid skip entry for seq in the ledger stream
// s (protocol.ParseSkip), reading only the messages on seq's skip subjects. The first
// valid one, not the last, is the skip: the stream is append-only, so the
// answer never changes once there is one, and a rebuild or a replay of an
// export finds the same skip as the live projector did.
func FindSkip(ctx context.Context, s jetstream.Stream, seq uint64) (protocol.SkipRecord, bool, error) {
	filter := protocol.SkipFilter(seq)
	for from := seq + 1; ; {
		m, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return protocol.SkipRecord{}, false, nil
		}
		if err != nil {
			return protocol.SkipRecord{}, false, fmt.Errorf("find skip of seq %d: %w", seq, err)
		}
		if rec, ok := protocol.ParseSkip(m.Sequence, m.Subject, m.Header, m.Data, seq); ok {
			return rec, true, nil
		}
		from = m.Sequence + 1
	}
}
