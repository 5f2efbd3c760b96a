package protocol_test

import (
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
