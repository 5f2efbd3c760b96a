package protocol_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

func TestParseCommandRejection(t *testing.T) {
	body := func(subject string, mutate func(map[string]any)) []byte {
		m := map[string]any{"subject": subject, "headers": map[string][]string{"CG-Agent-Id": {"a"}}, "data": []byte("x"),
			"error": map[string]any{"code": "bad_request", "message": "invalid tool command"}}
		if mutate != nil {
			mutate(m)
		}
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return b
	}
	r, vs := protocol.ParseCommandRejection(body("cg.v1.p.c.cmd.tool.search.x", nil))
	require.Empty(t, vs)
	require.Equal(t, []byte("x"), r.Data)
	require.Equal(t, protocol.CodeBadRequest, r.Error.Code)
	// A PMO built-in's command, refused by the tool credential serving it.
	_, vs = protocol.ParseCommandRejection(body("cg.v1.p.c.cmd.sys.pmo.internal.x", nil))
	require.Empty(t, vs)

	for _, subject := range []string{"cg.v1.p..cmd.tool.search", "cg.vx.p.c.cmd.tool.search",
		"cg.v1.p.c.cmd.tool.search.", "cg.v1.p.c.cmd.tool.search..x", ".cg.v1.p.c.cmd.tool.search", "cg.v1.p.c.cmd.tool",
		"cg.v1.p.c.cmd.sys.pmo.internal", "cg.v1.p.c.cmd.sys.pmo.internal.x.y", "cg.v1.p.c.cmd.sys.pmo.other.x", "cg.v1.p.c.cmd.tool.*", "cg.v1.p.c.cmd.tool.a b", "cgledger.v1.p.a.report"} {
		_, vs := protocol.ParseCommandRejection(body(subject, nil))
		require.Len(t, vs, 1, "subject %q", subject)
		require.Equal(t, "body.subject", vs[0].Field)
		require.Equal(t, protocol.VInvalidSubject, vs[0].Code)
	}

	// Every problem at once, each named.
	_, vs = protocol.ParseCommandRejection(body("cg.v1.p.c.cmd.tool.search", func(m map[string]any) {
		m["headers"] = map[string][]string{"": {"x"}, "bad name:": {"y"}, "Ok": {"z"}}
		m["data"] = "not base64!"
		m["error"] = map[string]any{"code": "internal", "message": strings.Repeat("m", protocol.MaxViolationText+1),
			"violations": []map[string]string{{"field": "f", "message": "no code"}}}
	}))
	require.Len(t, vs, 6, "%+v", vs)
	codes := []string{}
	for _, v := range vs {
		codes = append(codes, v.Field+" "+v.Code)
	}
	require.ElementsMatch(t, []string{
		"body.headers invalid_value", "body.headers invalid_value", "body.data invalid_type",
		"body.error.code invalid_value", "body.error.message too_large", "body.error.violations[0].code required",
	}, codes)
}

// TestRejectedRequestsKeepWhatTheClientSent: the header nats-server adds to
// a request from another account (its account and a round trip time that
// differs every time) is not the client's, and is left out.
func TestRejectedRequestsKeepWhatTheClientSent(t *testing.T) {
	h := nats.Header{"CG-Agent-Id": {"a"}, "Nats-Request-Info": {`{"acc":"A","rtt":1234}`}}
	rr := protocol.NewRejectedRequest("", h, []byte(`{}`))
	require.Equal(t, map[string][]string{"CG-Agent-Id": {"a"}}, rr.Headers)
}
