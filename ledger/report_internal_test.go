package ledger

import (
	"testing"

	"github.com/cgledger/cgledger/protocol"
	"github.com/stretchr/testify/require"
)

// A call whose report was accepted before after_execution had to equal the
// command's must still answer retries of that report (and Resume) as a
// duplicate: the check exempts a repeat of the accepted claim.
func TestMatchCallAfterExecution(t *testing.T) {
	rec := &protocol.CallRecord{CallID: protocol.CallID{ChannelID: "c", AgentID: "a", ToolCallID: "k"}, AfterExecution: protocol.AfterSuspend}
	in := &reportInput{channel: "c", id: protocol.Identity{AgentID: "a"}, payload: protocol.ReportPayload{AfterExecution: protocol.AfterTerminate}}
	vs := matchCall(rec, in, "fp-new")
	require.Len(t, vs, 1)
	require.Equal(t, protocol.Violation{Field: "payload.after_execution", Code: protocol.VMismatch, Message: vs[0].Message}, vs[0])

	rec.Claim = &protocol.Claim{Fingerprint: "fp-old", AfterExecution: protocol.AfterTerminate}
	require.Empty(t, matchCall(rec, in, "fp-old"), "a repeat of the accepted claim is not re-judged")
	require.Len(t, matchCall(rec, in, "fp-other"), 1)

	in.payload.AfterExecution = protocol.AfterSuspend
	require.Empty(t, matchCall(rec, in, "fp-other"))
}
