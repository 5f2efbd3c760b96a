package snapshot

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// chainCheckEntries is how many entries up to the snapshot's sequence the
// chain check recomputes (fewer when the stream holds fewer).
const chainCheckEntries = 1024

// errChainRead stops the stream read at the snapshot's sequence.
var errChainRead = errors.New("chain check read done")

// checkChain recomputes the links of the last min(chainCheckEntries, held)
// entries up to m.AppliedSeq from the stream, starting from the link the
// snapshot recorded before them, and requires each to equal the link the
// snapshot recorded and the last to equal m.ChainHead. A snapshot of
// another ledger, or of a stream re-created since, fails here. The stream
// does not store links (docs/tamper-evidence.md): this is how "the chain
// link at its sequence equals the stream's" is checked. The full chain from
// sequence 1 stays `cgledger verify`'s job.
func checkChain(ctx context.Context, views *projector.Store, m Manifest, first uint64, o RestoreOptions) error {
	head, err := protocol.ParseLink(m.ChainHead)
	if err != nil {
		return fmt.Errorf("chain head %q: %w", m.ChainHead, err)
	}
	start := max(first, 1)
	if m.AppliedSeq >= chainCheckEntries {
		start = max(start, m.AppliedSeq-chainCheckEntries+1)
	}
	if m.AppliedSeq == 0 {
		// Views that applied nothing hold nothing of any ledger.
		return nil
	}
	if start > m.AppliedSeq {
		// The stream holds no entry up to the snapshot's sequence (its
		// retention dropped them): nothing ties the snapshot to this
		// ledger, and a snapshot of another one would pass every other
		// check. A rebuild reads those entries from the archive instead.
		return fmt.Errorf("chain check: stream %s holds no entry up to the snapshot's seq %d (its first is %d): the snapshot cannot be tied to this ledger", o.Stream, m.AppliedSeq, first)
	}
	prev := protocol.Genesis
	if start > 1 {
		l, ok, err := views.LinkAt(start - 1)
		if err != nil {
			return fmt.Errorf("chain check: %w", err)
		}
		if !ok {
			return fmt.Errorf("chain check: the snapshot holds no link for seq %d to start from", start-1)
		}
		prev = l
	}
	v := protocol.NewChainVerifier(start, prev)
	_, err = stream.Read(ctx, o.JS, o.Stream, start, func(e protocol.Entry) error {
		want, ok, err := views.LinkAt(e.Seq)
		if err != nil {
			return err
		}
		var w *protocol.Link
		if ok {
			w = &want
		}
		if !v.Add(e.Seq, e.Subject, nats.Header(e.Headers), e.Data, w) {
			return errChainRead
		}
		if e.Seq >= m.AppliedSeq {
			return errChainRead
		}
		return nil
	})
	if err != nil && !errors.Is(err, errChainRead) {
		return fmt.Errorf("chain check: %w", err)
	}
	if bad, why := v.FirstBad(); bad != 0 {
		return fmt.Errorf("chain check against stream %s: %s (a snapshot of another ledger, or of a stream re-created since)", o.Stream, why)
	}
	if v.Next() != m.AppliedSeq+1 {
		return fmt.Errorf("chain check: read stream %s up to seq %d, not to the snapshot's %d", o.Stream, v.Next()-1, m.AppliedSeq)
	}
	if v.Head() != head {
		return fmt.Errorf("chain check against stream %s: link at seq %d recomputed %s, the snapshot says %s", o.Stream, m.AppliedSeq, v.Head(), head)
	}
	return nil
}
