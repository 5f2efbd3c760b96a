package protocol

// ExecutionQuery names a delivered command's call, the tool.call card it
// points at and the tool definition it asks for.
type ExecutionQuery struct {
	Project, Channel, AgentTurnID, ToolCallID string
	// ToolCallCardID is the payload's tool_call_card_id.
	ToolCallCardID string
	// ToolName is the definition to read; empty reads none.
	ToolName string
	// Fresh reads everything from the server. Executors set it for a
	// redelivered command, whose call another process may have moved on.
	Fresh bool
	// SkipCancel leaves the cancellation unread (Canceled false, CancelErr
	// nil): the executor reads it itself, concurrently with the rest and
	// with running a pure tool, and waits for it before any answer.
	SkipCancel bool
}

// ExecutionInputs is what an executor reads before running a call. Each
// read has its own error: an executor decides per read whether the call can
// go on.
type ExecutionInputs struct {
	Record    *CallRecord
	RecordErr error
	Canceled  bool
	CancelErr error
	Card      *StoredCard
	CardErr   error
	Tool      *StoredTool
	ToolErr   error
}

// PinnedToolSeq is the definition entry a call pinned at dispatch
// (rec.ToolDefSeq) when the definition read for tool is another one (a new
// version was registered since, or none could be read): the executor reads
// the pinned one instead. Zero when there is nothing to change.
func PinnedToolSeq(rec *CallRecord, recErr error, read *StoredTool, tool string) uint64 {
	if recErr != nil || rec == nil || rec.ToolDefSeq == 0 || rec.ToolName != tool || !ValidIdentifier(tool) {
		return 0
	}
	if read != nil && read.Seq == rec.ToolDefSeq {
		return 0
	}
	return rec.ToolDefSeq
}
