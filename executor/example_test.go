package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// A Go tool in twenty lines: "shout" upper-cases its text argument. The
// executor consumes the tool's commands, validates the arguments against
// the definition's schema, runs the tool under its deadline, and writes
// the result card and the report through the ledger.
func Example() {
	ctx := context.Background()
	nc, l, stop := ledgerOnEmbeddedServer()
	defer stop()

	shout := executor.ToolFunc(func(ctx context.Context, call *executor.Call) executor.Outcome {
		text, _ := call.Arguments["text"].(string)
		return executor.Success(map[string]string{"text": strings.ToUpper(text)})
	})
	def := &protocol.ToolDefinition{
		ToolName:       "shout",
		Parameters:     json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
		TargetSubject:  "cg.v1.{project_id}.{channel_id}.cmd.tool.shout",
		AfterExecution: protocol.AfterSuspend,
		Limits:         protocol.ToolLimits{TimeoutMSDefault: 10_000, TimeoutMSMax: 60_000},
	}
	ex, err := executor.New(l, nc, executor.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ex.Register("shout", shout, def); err != nil {
		log.Fatal(err)
	}
	if err := ex.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer ex.Stop(ctx)

	// An agent calls it.
	id := protocol.Identity{AgentID: "alice", AgentTurnID: "turn-1", TurnEpoch: 1, ToolCallID: "call-1"}
	_, err = l.Dispatch(ctx, protocol.DispatchRequest{
		Subject:  protocol.ToolCommandSubject("v1", "demo", "main", "shout"),
		Identity: id,
		Card: protocol.Card{
			CardID: "card-1", ProjectID: "demo", Type: protocol.CardToolCall, AuthorID: "alice",
			AgentTurnID: id.AgentTurnID, ToolCallID: id.ToolCallID,
			Content: json.RawMessage(`{"tool_name":"shout","arguments":{"text":"hello"}}`),
		},
		Payload: protocol.ToolCommandPayload{ToolCallCardID: "card-1", ToolName: "shout", AfterExecution: protocol.AfterSuspend},
	})
	if err != nil {
		log.Fatal(err)
	}
	result := waitForResult(ctx, l, "demo", id)
	fmt.Println(string(result.Card.Content))
	// Output:
	// {"status":"success","result":{"text":"HELLO"}}
}

// waitForResult polls the call until it is reported and returns its
// result card.
func waitForResult(ctx context.Context, l *ledger.Ledger, project string, id protocol.Identity) *protocol.StoredCard {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		rec, err := l.GetCall(ctx, project, id.AgentTurnID, id.ToolCallID)
		if err != nil {
			log.Fatal(err)
		}
		if rec.Claim != nil {
			card, err := l.GetCard(ctx, project, rec.Claim.ToolResultCardID)
			if err != nil {
				log.Fatal(err)
			}
			return card
		}
		select {
		case <-ctx.Done():
			log.Fatal("the call was not reported")
		case <-tick.C:
		}
	}
}

// ledgerOnEmbeddedServer opens a ledger on a throwaway JetStream server;
// the returned function stops everything.
func ledgerOnEmbeddedServer() (*nats.Conn, *ledger.Ledger, func()) {
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
	l, err := ledger.Open(context.Background(), nc, ledger.Config{})
	if err != nil {
		log.Fatal(err)
	}
	return nc, l, func() {
		l.Close()
		nc.Close()
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}
