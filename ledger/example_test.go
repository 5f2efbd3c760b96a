package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// embedded starts a throwaway JetStream server and connects to it; the
// returned function stops both.
func embedded() (*nats.Conn, func()) {
	dir, err := os.MkdirTemp("", "cgledger-example-")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := natsserver.Start(natsserver.Config{StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	return nc, func() {
		nc.Close()
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}

// A dispatch appends the tool.call card and the command; the same dispatch
// again is recognized by its (agent_turn_id, tool_call_id) and answered
// with the first one's sequences.
func Example() {
	nc, stop := embedded()
	defer stop()
	ctx := context.Background()
	l, err := ledger.Open(ctx, nc, ledger.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	id := protocol.Identity{AgentID: "alice", AgentTurnID: "turn-1", TurnEpoch: 1, ToolCallID: "call-1"}
	req := protocol.DispatchRequest{
		Subject:  protocol.ToolCommandSubject("v1", "demo", "main", "echo"),
		Identity: id,
		Card: protocol.Card{
			CardID: "card-1", ProjectID: "demo", Type: protocol.CardToolCall, AuthorID: "alice",
			AgentTurnID: id.AgentTurnID, ToolCallID: id.ToolCallID,
			Content: json.RawMessage(`{"tool_name":"echo","arguments":{"text":"hi"}}`),
		},
		Payload: protocol.ToolCommandPayload{ToolCallCardID: "card-1", ToolName: "echo", AfterExecution: protocol.AfterSuspend},
	}
	first, err := l.Dispatch(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	again, err := l.Dispatch(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(first.Subject)
	fmt.Println("duplicate:", first.Duplicate, again.Duplicate)
	fmt.Println("same command:", first.CommandSeq == again.CommandSeq)
	// Output:
	// cg.v1.demo.main.cmd.tool.echo
	// duplicate: false true
	// same command: true
}
