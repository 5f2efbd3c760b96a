package ledger_test

import (
	"strings"
	"testing"

	"github.com/cgledger/cgledger/protocol"
	"github.com/stretchr/testify/require"
)

// TestAmplifyingBodiesGetABoundedRecordedRefusal: a body whose violations
// would each repeat a path as long as the body (long nested keys with
// duplicates at the bottom), or that nests deeper than any reader can
// handle, is refused with a reply and a rejection entry of bounded size.
func TestAmplifyingBodiesGetABoundedRecordedRefusal(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	nc := e.srv.Connect(t)
	long := strings.Repeat("k", 1000)
	var b strings.Builder
	const depth = 600
	for i := range depth {
		b.WriteString(`{"` + long + string(rune('a'+i%26)) + `":`)
	}
	b.WriteString("{")
	for i := range 120 {
		if i > 0 {
			b.WriteString(",")
		}
		k := `"dup` + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `"`
		b.WriteString(k + ":1," + k + ":2")
	}
	b.WriteString("}" + strings.Repeat("}", depth))
	body := `{"card_id":"c-amp","project_id":"p1","type":"tool.call","author_id":"a","agent_turn_id":"t","tool_call_id":"k","content":{"tool_name":"x","arguments":` + b.String() + `}}`
	require.Less(t, len(body), protocol.MaxRequestBytes)

	r := request(t, nc, protocol.APISubject("p1", "a", protocol.OpCardPut), nil, body)
	require.Equal(t, "bad_request", r.Error.Code)
	require.NotZero(t, r.Error.RejectionSeq, "the refusal is recorded")
	require.LessOrEqual(t, len(r.Error.Violations), 101)
	for _, v := range r.Error.Violations {
		require.LessOrEqual(t, len(v.Field), protocol.MaxViolationText+3)
		require.LessOrEqual(t, len(v.Message), protocol.MaxViolationText+3)
	}

	deep := strings.Repeat("[", protocol.MaxJSONDepth+10) + strings.Repeat("]", protocol.MaxJSONDepth+10)
	body = `{"card_id":"c-deep","project_id":"p1","type":"tool.call","author_id":"a","agent_turn_id":"t","tool_call_id":"k","content":{"tool_name":"x","arguments":{"a":` + deep + `}}}`
	r = request(t, nc, protocol.APISubject("p1", "a", protocol.OpCardPut), nil, body)
	require.Equal(t, "bad_request", r.Error.Code)
	require.Equal(t, protocol.VTooLarge, r.Error.Violations[0].Code)
	require.NotZero(t, r.Error.RejectionSeq)
}
