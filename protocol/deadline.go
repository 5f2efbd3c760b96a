package protocol

import "time"

// The ledger's own answer to a call that reached its deadline with no
// accepted report (docs/protocol.md, "Deadlines").
const (
	// DeadlineSourceID is source_id (and the result card's author_id) of
	// the timeout the ledger records itself.
	DeadlineSourceID = "cgledger-deadline"
	// TaxonomyDeadlineTimeout is error.detail.taxonomy_code of that
	// timeout. R-TIMEOUT-001 stays the executor's own (the tool ran out of
	// time while it watched it).
	TaxonomyDeadlineTimeout = "R-TIMEOUT-002"
	// DeadlineCancelReason is the reason of the cancel the ledger stores
	// after recording a call's timeout, so that a tool still running it
	// stops.
	DeadlineCancelReason = "deadline: the ledger recorded the call's timeout"
)

// CallTimeout is a call's time budget: the requested timeout_ms or the
// tool's default, capped at the tool's maximum. def nil (a tool not in the
// registry) means the requested timeout_ms, else DefaultTimeoutMS.
func CallTimeout(def *ToolDefinition, requestedMS int64) time.Duration {
	if def == nil {
		if requestedMS > 0 {
			return time.Duration(requestedMS) * time.Millisecond
		}
		return DefaultTimeoutMS * time.Millisecond
	}
	ms := def.Limits.TimeoutMSDefault
	if requestedMS > 0 {
		ms = requestedMS
	}
	if def.Limits.TimeoutMSMax > 0 && ms > def.Limits.TimeoutMSMax {
		ms = def.Limits.TimeoutMSMax
	}
	if ms <= 0 {
		ms = DefaultTimeoutMS
	}
	return time.Duration(ms) * time.Millisecond
}
