package main

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/protocol"
)

// TestRefusedDispatchFailsAtOnce: NATS refusing the dispatch's publish (a
// permissions violation, reported on the connection, not to the request)
// ends the dispatch at once as forbidden, instead of at its deadline with
// an error that says to ask again.
func TestRefusedDispatchFailsAtOnce(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		Users: []*server.User{{Username: "u", Password: "p", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Deny: []string{"cgledger.>", "cg.>"}}}}}})
	require.NoError(t, err)
	srv.Start()
	t.Cleanup(srv.Shutdown)
	require.True(t, srv.ReadyForConnections(time.Minute))
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("u", "p"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	l := newRefusingLedger(nc, client.New(nc, client.WithActor("a1")))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = l.Dispatch(ctx, protocol.DispatchRequest{Subject: "cg.v1.p1.mcp.cmd.tool.echo",
		Identity: protocol.Identity{AgentID: "a1", AgentTurnID: "t1", TurnEpoch: 1, ToolCallID: "c1"}})
	require.Error(t, err)
	pe, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeForbidden, pe.Code, pe.Message)
	require.Contains(t, pe.Message, "ermissions")
	require.NoError(t, ctx.Err(), "refused before its deadline")
}
