package ledger

import (
	"context"
	"sync"

	"github.com/cgledger/cgledger/protocol"
)

// ReadExecutionInputs reads the call record, the cancellation, the tool.call
// card and the tool definition at once. Unless q.Fresh, the record, card
// and definition come from this process's memory when it wrote or read them
// before (the ledger that dispatched the call usually did): the record as
// dispatch left it (an executor only acts on a first delivery's record,
// which nothing else has moved on yet, and the report path re-checks it),
// the card as stored (cards never change), the definition as last seen
// (dropped when any ledger process writes a new one). The cancellation is
// always read from the server, so a cancel recorded by any process before
// the read is never missed. A record not in memory, or any on a redelivery,
// is overlaid with the stream's report and wakeup (the bucket is not
// written after dispatch), so a reported call is never taken for one to run.
func (l *Ledger) ReadExecutionInputs(ctx context.Context, q protocol.ExecutionQuery) protocol.ExecutionInputs {
	var in protocol.ExecutionInputs
	var wg sync.WaitGroup
	if !q.SkipCancel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in.Canceled, in.CancelErr = l.Canceled(ctx, q.Project, q.Channel, q.AgentTurnID, q.ToolCallID)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if q.Fresh {
			in.Card, in.CardErr = l.GetCard(ctx, q.Project, q.ToolCallCardID)
		} else {
			in.Card, in.CardErr = l.cardCached(ctx, q.Project, q.ToolCallCardID)
		}
	}()
	if protocol.ValidIdentifier(q.ToolName) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if q.Fresh {
				in.Tool, in.ToolErr = l.GetTool(ctx, q.Project, q.ToolName)
			} else {
				in.Tool, in.ToolErr = l.toolCached(ctx, q.Project, q.ToolName)
			}
		}()
	}
	// A record this process remembers is as dispatch left it or newer (it
	// wrote or read it); one read from the bucket is only as dispatch left
	// it, however far the call went since.
	_, remembered := l.cache.records.get(callKey(q.Project, q.AgentTurnID, q.ToolCallID))
	in.Record, in.RecordErr = l.getCall(ctx, q.Project, q.AgentTurnID, q.ToolCallID, !q.Fresh)
	if (q.Fresh || !remembered) && in.RecordErr == nil {
		// A redelivery, or a call this process does not remember (another
		// process dispatched it, or this one restarted; after a crash of
		// the server too a redelivery can come back as a first delivery):
		// whether the call is reported and woken is the stream's to tell
		// (the bucket is not written after dispatch). As GetCall answers
		// (the call.get a remote executor reads).
		in.Record, in.RecordErr = l.streamView(ctx, in.Record, true)
		if in.RecordErr == nil {
			in.RecordErr = l.callSequences(ctx, in.Record)
		}
	}
	wg.Wait()
	// The definition the call pinned at dispatch, when a new one was
	// registered since (or the cached one is not it): one more read, only
	// then.
	if pin := protocol.PinnedToolSeq(in.Record, in.RecordErr, in.Tool, q.ToolName); pin != 0 {
		in.Tool, in.ToolErr = l.GetToolAt(ctx, q.Project, q.ToolName, pin)
	}
	return in
}
