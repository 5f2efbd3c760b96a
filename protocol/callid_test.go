package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestCallIDEncodesInPlace: the values that embed CallID encode (and decode)
// exactly as they did with its fields spelled out, so stored bytes, chain
// and digests are unchanged.
func TestCallIDEncodesInPlace(t *testing.T) {
	id := protocol.CallID{ProjectID: "p", ChannelID: "c", AgentID: "a", AgentTurnID: "t", TurnEpoch: 0, ToolCallID: "k"}
	spelled := `"project_id":"p","channel_id":"c","agent_id":"a","agent_turn_id":"t","turn_epoch":0,"tool_call_id":"k"`
	cases := []struct {
		v    any
		want string
	}{
		{protocol.CallRecord{State: protocol.StateDispatched, CallID: id, StepID: "s", Subject: "sub"},
			`{"state":"dispatched",` + spelled + `,"step_id":"s","subject":"sub","after_execution":"","tool_call_card_id":"","card_seq":0,"card_metadata":{"trace_id":"","parent_step_id":"","step_id":""},"dispatch_fingerprint":""}`},
		{protocol.ReportEntry{CallID: id, Status: "success"},
			`{` + spelled + `,"status":"success","after_execution":"","effective_after_execution":"","tool_result_card_id":"","tool_call_card_id":"","source_id":"","source_function":""}`},
		{protocol.DuplicateEntry{CallID: id, Status: "success", OriginalSeq: 3},
			`{` + spelled + `,"status":"success","tool_result_card_id":"","source_id":"","original_seq":3}`},
	}
	for _, c := range cases {
		b, err := json.Marshal(c.v)
		require.NoError(t, err)
		// Byte for byte: the identity's fields in their old place.
		require.Equal(t, c.want, string(b))
	}
}
