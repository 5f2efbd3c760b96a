package protocol_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

func TestPauseGrammar(t *testing.T) {
	s := protocol.PauseSubject("v1", "p1", "wire")
	require.Equal(t, "cg.v1.p1.pause.wire", s)
	sub, err := protocol.ParseSubject(s)
	require.NoError(t, err)
	require.Equal(t, protocol.SubjectPause, sub.Kind)
	require.Equal(t, "wire", sub.Tool)
	require.Equal(t, "pause", sub.Kind.String())
	_, err = protocol.ParseSubject("cg.v1.p1.pause.bad name")
	require.Error(t, err)

	h := nats.Header{}
	h.Set(protocol.HeaderEntryKind, string(protocol.KindToolPause))
	require.Equal(t, protocol.Recognition{Kind: "tool_pause"}, protocol.RecognizeEntry(s, h))
	require.Equal(t, protocol.UnrecognizedKindMismatch, protocol.RecognizeEntry(protocol.ToolSubject("v1", "p1", "wire"), h).Code)
}

func TestParseToolPauseRequestListsEveryViolation(t *testing.T) {
	r, vs := protocol.ParseToolPauseRequest([]byte(`{"project_id":"p1","tool_name":"wire","reason":"outage"}`))
	require.Empty(t, vs)
	require.Equal(t, protocol.ToolPauseRequest{ProjectID: "p1", ToolName: "wire", Reason: "outage"}, r)

	_, vs = protocol.ParseToolPauseRequest([]byte(`{"tool_name":"a b","reason":"` + strings.Repeat("x", protocol.MaxOperatorReasonBytes+1) + `","force":true}`))
	codes := map[string]string{}
	for _, v := range vs {
		codes[v.Field] = v.Code
	}
	require.Len(t, vs, 4, "%v", vs)
	require.Equal(t, protocol.VRequired, codes["body.project_id"])
	require.Contains(t, codes, "body.tool_name")
	require.Equal(t, protocol.VTooLarge, codes["body.reason"])
	require.Equal(t, protocol.VInvalidValue, codes["body.force"])
	_, vs = protocol.ParseToolPauseRequest([]byte(`{"project_id":"p1","tool_name":"wire"}`))
	require.Len(t, vs, 1)
	require.Equal(t, "body.reason", vs[0].Field)
}

// TestToolPauseResultJSON: a resume's answer always has released, 0
// included; a pause's has none.
func TestToolPauseResultJSON(t *testing.T) {
	b, err := json.Marshal(protocol.ToolPauseResult{Seq: 3, ToolName: "search"})
	require.NoError(t, err)
	require.JSONEq(t, `{"seq":3,"tool_name":"search","paused":false,"released":0}`, string(b))
	b, err = json.Marshal(protocol.ToolPauseResult{Seq: 4, ToolName: "search", Released: 2})
	require.NoError(t, err)
	require.JSONEq(t, `{"seq":4,"tool_name":"search","paused":false,"released":2}`, string(b))
	b, err = json.Marshal(protocol.ToolPauseResult{Seq: 5, ToolName: "search", Paused: true})
	require.NoError(t, err)
	require.JSONEq(t, `{"seq":5,"tool_name":"search","paused":true}`, string(b))
	var back protocol.ToolPauseResult
	require.NoError(t, json.Unmarshal([]byte(`{"seq":4,"tool_name":"search","paused":false,"released":2}`), &back))
	require.Equal(t, protocol.ToolPauseResult{Seq: 4, ToolName: "search", Released: 2}, back)
}
