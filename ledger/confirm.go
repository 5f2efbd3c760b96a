package ledger

import (
	"context"

	"github.com/cgledger/cgledger/protocol"
)

// dispatchConfirmed reports whether a call record stands for a dispatch
// that went through. Dispatch writes the card and creates the record at
// once, so for a moment a record exists whose card was refused (its id
// holds another card) and which that dispatch is about to take back; no
// report, cancel or lookup may treat it as a call. A record is confirmed
// once its command is published (its sequences are recorded), or while its
// tool.call card is stored and is this call's, as the record describes it.
// stored is false when the card is not stored (yet).
func (l *Ledger) dispatchConfirmed(ctx context.Context, rec *protocol.CallRecord) (confirmed, stored bool, err error) {
	if (rec.State != protocol.StateDispatched && rec.State != protocol.StateAwaitingApproval) || rec.CommandSeq != 0 {
		return true, true, nil
	}
	sc, err := l.cardCached(ctx, rec.ProjectID, rec.ToolCallCardID)
	if isCode(err, protocol.CodeUnknownCard) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	c := &sc.Card
	return c.Type == protocol.CardToolCall && c.AgentTurnID == rec.AgentTurnID && c.ToolCallID == rec.ToolCallID && c.Metadata == rec.CardMetadata, true, nil
}
