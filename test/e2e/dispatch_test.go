package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
)

// dispatchEchoCalls dispatches n echo calls (turn turn, ids c0000..) to s
// as its admin from a few connections at once; the built-in echo runs and
// reports each.
func dispatchEchoCalls(t *testing.T, s *server, turn string, n int) {
	t.Helper()
	creds := filepath.Join(s.Data, "auth", "admin.creds")
	_, inbox, err := auth.ReadCreds(creds)
	require.NoError(t, err)
	nc, err := nats.Connect(s.natsURL(), nats.UserCredentials(creds), nats.CustomInboxPrefix(inbox))
	require.NoError(t, err)
	defer nc.Close()
	cl := client.New(nc, client.WithActor("alice"), client.WithTimeout(30*time.Second))
	ids := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				id := fmt.Sprintf("c%04d", i)
				card := "cc-" + turn + "-" + id
				_, err := cl.Dispatch(context.Background(), protocol.DispatchRequest{
					Subject:  protocol.ToolCommandSubject(protocol.DefaultVersion, "demo", "main", "echo"),
					Identity: protocol.Identity{AgentID: "alice", AgentTurnID: turn, TurnEpoch: 1, ToolCallID: id},
					Card: protocol.Card{CardID: card, ProjectID: "demo", Type: protocol.CardToolCall, AuthorID: "alice", AgentTurnID: turn, ToolCallID: id,
						Content:  json.RawMessage(fmt.Sprintf(`{"tool_name":"echo","arguments":{"i":%d}}`, i)),
						Metadata: protocol.CardMetadata{TraceID: fmt.Sprintf("%032x", i+1), ParentStepID: turn, StepID: "step-" + id}},
					Payload: protocol.ToolCommandPayload{ToolCallCardID: card, ToolName: "echo", AfterExecution: protocol.AfterSuspend, TimeoutMS: 60000},
				})
				if err != nil {
					errs <- fmt.Errorf("dispatch %s: %w", id, err)
				}
			}
		}()
	}
	for i := range n {
		ids <- i
	}
	close(ids)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
