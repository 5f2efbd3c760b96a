package protocol_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestCheckReadRequestChecksAsTheAPIServerDoes: a read another part of the
// server answers (inbox.list) is checked like the ledger's own: bad subject
// tokens and a body naming another project or agent are refused with every
// violation, and a reply subject that is not an inbox is never answered.
func TestCheckReadRequestChecksAsTheAPIServerDoes(t *testing.T) {
	op := protocol.OpInboxList
	msg := func(subject, reply, body string) *nats.Msg {
		return &nats.Msg{Subject: subject, Reply: reply, Data: []byte(body)}
	}
	c, answer, err := protocol.CheckReadRequest(op, msg("cgledger.v1.p1.a1.inbox.list", "_INBOX.x", `{"project_id":"p1","agent_id":"a1"}`))
	require.NoError(t, err)
	require.True(t, answer)
	require.Equal(t, protocol.Caller{Project: "p1", Actor: "a1"}, c)

	_, answer, err = protocol.CheckReadRequest(op, msg("cgledger.v1.p1.a1.inbox.list", "_INBOX.x", `{"project_id":"p2","agent_id":"a2"}`))
	require.True(t, answer)
	e, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeForbidden, e.Code)
	require.Len(t, e.Violations, 2, "%+v", e.Violations)

	_, answer, err = protocol.CheckReadRequest(op, msg("cgledger.v1.p1.a1.inbox.list", "cg.v1.p1.c1.cmd.agent.w.wakeup", `{"project_id":"p1","agent_id":"a1"}`))
	require.False(t, answer, "never answered on a subject that is not an inbox")
	e, ok = protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "reply", e.Violations[0].Field)

	_, answer, err = protocol.CheckReadRequest(op, msg("cgledger.v1.p1.a1.inbox.list", "", `{}`))
	require.NoError(t, err)
	require.False(t, answer, "no reply subject: nothing to answer")
}
