package protocol_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestParseApprovalRequestListsEveryViolation: an approve or deny body with
// a bad digest, a reason over the limit and members the decision does not
// take (an "approver" claiming a name, a misspelt member) is refused with
// each of them listed; a good body parses.
func TestParseApprovalRequestListsEveryViolation(t *testing.T) {
	digest := protocol.ArgumentsDigest([]byte(`{}`))
	good := `{"project_id":"p","agent_turn_id":"t","tool_call_id":"c","tool_call_card_id":"cc","arguments_digest":"` + digest + `","reason":"ok"}`
	r, vs := protocol.ParseApprovalRequest([]byte(good))
	require.Empty(t, vs)
	require.Equal(t, digest, r.ArgumentsDigest)

	bad := `{"project_id":"p","agent_turn_id":"t","tool_call_id":"c","tool_call_card_id":"cc","arguments_digest":"md5:1",` +
		`"reason":"` + strings.Repeat("x", protocol.MaxApprovalReasonBytes+1) + `","approver":"mallory","arguments_digets":"x"}`
	_, vs = protocol.ParseApprovalRequest([]byte(bad))
	fields := map[string]string{}
	for _, v := range vs {
		fields[v.Field] = v.Code
	}
	require.Equal(t, map[string]string{
		"body.arguments_digest": protocol.VInvalidValue,
		"body.reason":           protocol.VTooLarge,
		"body.approver":         protocol.VInvalidValue,
		"body.arguments_digets": protocol.VInvalidValue,
	}, fields)
}
