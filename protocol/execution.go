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
