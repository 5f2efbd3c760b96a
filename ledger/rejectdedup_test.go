package ledger_test

import (
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestCommandRejectionIsRecordedOncePerCommand: a refused command that is
// delivered again (its ack lost after the rejection entry was written) is
// rejected again by whoever holds it, in process or over the wire; the
// ledger keeps one rejection entry for it and answers the repeat as a
// duplicate of the first. Another command is recorded on its own.
func TestCommandRejectionIsRecordedOncePerCommand(t *testing.T) {
	e := newEnv(t)
	serveAPI(t, e)
	ctx := ctxT(t)
	subj := "cg.v1.proj.main.cmd.tool.echo"
	h := nats.Header{"CG-Agent-Id": {"a1"}, "Nats-Msg-Id": {"cmd.proj.t1.k1"}}
	data := []byte(`{"args":{}}`)
	refusal := func() *protocol.Error {
		return protocol.NewError(protocol.CodeBadRequest, protocol.Violations{{Field: "payload.args", Code: protocol.VForbidden, Message: "inline args are not allowed"}}, "invalid tool command")
	}
	count := func() int { return len(e.subjectEntries(t, "cg.v1.proj.*.ledger.rejection.>")) }

	first := refusal()
	require.NoError(t, e.l.RejectCommand(ctx, subj, h, data, first))
	require.NotZero(t, first.Seq)
	again := refusal()
	require.NoError(t, e.l.RejectCommand(ctx, subj, h, data, again))
	require.Equal(t, first.Seq, again.Seq, "the repeat answers the first entry")
	require.Equal(t, 1, count(), "one rejection entry per command")

	// Over the wire, headers in another order and names in another case:
	// the same command.
	body, err := json.Marshal(map[string]any{
		"subject": subj, "headers": map[string][]string{"nats-msg-id": {"cmd.proj.t1.k1"}, "cg-agent-id": {"a1"}},
		"data": base64.StdEncoding.EncodeToString(data), "error": refusal(),
	})
	require.NoError(t, err)
	r := request(t, e.nc, protocol.APISubject("proj", "echo", protocol.OpCommandReject), nil, string(body))
	require.True(t, r.OK, "%+v", r.Error)
	var res struct {
		Seq       uint64 `json:"seq"`
		Duplicate bool   `json:"duplicate"`
	}
	require.NoError(t, json.Unmarshal(r.Result, &res))
	require.Equal(t, first.Seq, res.Seq)
	require.True(t, res.Duplicate, "the answer says duplicate")
	require.Equal(t, 1, count())

	// Another command (another body) is its own rejection.
	other := refusal()
	require.NoError(t, e.l.RejectCommand(ctx, subj, h, []byte(`{"args":{"x":1}}`), other))
	require.NotEqual(t, first.Seq, other.Seq)
	require.Equal(t, 2, count())
	r = request(t, e.nc, protocol.APISubject("proj", "echo", protocol.OpCommandReject), nil,
		`{"subject":"`+subj+`","data":"`+base64.StdEncoding.EncodeToString([]byte("not json"))+`","error":{"code":"bad_request","message":"no"}}`)
	require.True(t, r.OK, "%+v", r.Error)
	res.Duplicate = false
	require.NoError(t, json.Unmarshal(r.Result, &res))
	require.False(t, res.Duplicate, "a first rejection is no duplicate: %s", r.Result)
	require.Equal(t, 3, count())
}
