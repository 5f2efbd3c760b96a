package protocol

import "time"

// Inbox states of an InboxEntry.
const (
	InboxPending  = "pending"
	InboxConsumed = "consumed"
)

// InboxEntry is a reported result in an agent's Inbox: the report's routing
// and pointer fields, the effective after_execution, and whether (as of the
// query) the agent has consumed it.
type InboxEntry struct {
	ReportSeq               uint64     `json:"report_seq"`
	ReportedAt              time.Time  `json:"reported_at"`
	ProjectID               string     `json:"project_id"`
	ChannelID               string     `json:"channel_id"`
	AgentID                 string     `json:"agent_id"`
	AgentTurnID             string     `json:"agent_turn_id"`
	TurnEpoch               uint64     `json:"turn_epoch"`
	ToolCallID              string     `json:"tool_call_id"`
	StepID                  string     `json:"step_id,omitempty"`
	Status                  string     `json:"status"`
	AfterExecution          string     `json:"after_execution"`
	EffectiveAfterExecution string     `json:"effective_after_execution"`
	ToolResultCardID        string     `json:"tool_result_card_id"`
	ToolCallCardID          string     `json:"tool_call_card_id,omitempty"`
	ToolName                string     `json:"tool_name,omitempty"`
	SourceID                string     `json:"source_id,omitempty"`
	State                   string     `json:"state"`
	ConsumedSeq             uint64     `json:"consumed_seq,omitempty"`
	ConsumedAt              *time.Time `json:"consumed_at,omitempty"`
}

// InboxListRequest is the body of inbox.list: one page of the agent's
// pending results, in report order. Cursor is the NextCursor of the page
// before (empty for the first); Limit 0 means the default page size.
type InboxListRequest struct {
	ProjectID string `json:"project_id"`
	AgentID   string `json:"agent_id"`
	Cursor    string `json:"cursor,omitempty"`
	Limit     int    `json:"limit,omitempty"`
}

// InboxListResult is one page of inbox.list.
type InboxListResult struct {
	// AsOfSeq is the ledger sequence the page reads the views at.
	AsOfSeq uint64 `json:"as_of_seq"`
	// LedgerSeq is the ledger stream's last sequence when the request
	// arrived. AsOfSeq at or past it means every result reported before
	// the request is accounted for (listed, or consumed).
	LedgerSeq uint64       `json:"ledger_seq"`
	Items     []InboxEntry `json:"items"`
	// NextCursor continues the listing; empty when there is no more.
	NextCursor string `json:"next_cursor,omitempty"`
}
