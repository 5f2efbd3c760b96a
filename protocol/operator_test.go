package protocol_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestResolutionSubjectIsInTheGrammar: a resolution entry's subject parses
// back to its call, and an entry of kind resolution on it is recognized
// (on another kind's subject it is not).
func TestResolutionSubjectIsInTheGrammar(t *testing.T) {
	s := protocol.ResolutionSubject("v1", "p1", "c1", "turn-1", "call-1")
	require.Equal(t, "cg.v1.p1.c1.ledger.resolution.turn-1.call-1", s)
	sub, err := protocol.ParseSubject(s)
	require.NoError(t, err)
	require.Equal(t, protocol.SubjectResolution, sub.Kind)
	require.Equal(t, "resolution", sub.Kind.String())
	require.Equal(t, "turn-1", sub.AgentTurnID)
	require.Equal(t, "call-1", sub.ToolCallID)
	h := nats.Header{}
	h.Set(protocol.HeaderEntryKind, string(protocol.KindResolution))
	require.False(t, protocol.RecognizeEntry(s, h).Unrecognized())
	r := protocol.RecognizeEntry(protocol.CancelSubject("v1", "p1", "c1", "turn-1", "call-1"), h)
	require.Equal(t, protocol.UnrecognizedKindMismatch, r.Code)
}

// TestOperatorRequestsListEveryViolation: call.cancel and call.resolve
// bodies are refused with every problem at once: ids, the reason
// (required, bounded), the effect, and any member they do not have.
func TestOperatorRequestsListEveryViolation(t *testing.T) {
	fields := func(vs protocol.Violations) []string {
		var out []string
		for _, v := range vs {
			out = append(out, v.Field)
		}
		return out
	}
	_, vs := protocol.ParseResolveRequest([]byte(`{"project_id":"p","agent_turn_id":"a.b","efect":"applied","reason":""}`))
	require.ElementsMatch(t, []string{"body.agent_turn_id", "body.tool_call_id", "body.effect", "body.reason", "body.efect"}, fields(vs))
	_, vs = protocol.ParseResolveRequest([]byte(`{"project_id":"p","agent_turn_id":"t","tool_call_id":"c","effect":"maybe","reason":"` + strings.Repeat("x", 1025) + `"}`))
	require.ElementsMatch(t, []string{"body.effect", "body.reason"}, fields(vs))
	r, vs := protocol.ParseResolveRequest([]byte(`{"project_id":"p","agent_turn_id":"t","tool_call_id":"c","effect":"not_applied","reason":"checked upstream"}`))
	require.Empty(t, vs)
	require.Equal(t, protocol.ResolveRequest{ProjectID: "p", AgentTurnID: "t", ToolCallID: "c", Effect: protocol.EffectNotApplied, Reason: "checked upstream"}, r)

	_, vs = protocol.ParseOperatorCancelRequest([]byte(`{"project_id":"p","agent_id":"a","tool_call_id":"c"}`))
	require.ElementsMatch(t, []string{"body.agent_turn_id", "body.reason", "body.agent_id"}, fields(vs))
	_, vs = protocol.ParseOperatorCancelRequest([]byte(`[]`))
	require.NotEmpty(t, vs)
}
