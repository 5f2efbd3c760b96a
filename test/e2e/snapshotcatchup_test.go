package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/internal/servetest"
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

// TestViewsRestoreKilledDuringItsCatchUp: serve without views restores a
// snapshot that is thousands of entries behind the stream and is killed
// (SIGKILL) while it catches up from the snapshot's sequence. Started
// again, it keeps the restored, partly caught-up views (no second
// restore), catches up, and ends with the digest the views had before; the
// chain verifies.
func TestViewsRestoreKilledDuringItsCatchUp(t *testing.T) {
	data, np, hp := t.TempDir(), servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, np, hp)
	snapshotCalls(t, s, "a", 2)
	out, code := s.run(t, "views", "snapshot", "--json")
	require.Equal(t, 0, code, out)
	var m protocol.ViewsSnapshotResult
	require.NoError(t, json.Unmarshal([]byte(out), &m))
	// Enough entries after the snapshot that its catch-up takes a while.
	dispatchEchoCalls(t, s, "after", 3000)
	before := caughtUpDigest(t, s)
	require.Greater(t, before.AppliedSeq, m.AppliedSeq+10000)
	s.kill(t)

	// A kill that lands after the catch-up ended tests nothing: try again
	// from no views until one lands inside it.
	landed := false
	for attempt := 0; attempt < 5 && !landed; attempt++ {
		require.NoError(t, os.RemoveAll(filepath.Join(data, "views")))
		cmd, log := startUnready(t, data, np, hp)
		waitLog(t, log, "views restored from a snapshot: catching up", 2*time.Minute)
		kill9(t, cmd)
		landed = !strings.Contains(log.String(), "projector caught up")
		t.Logf("attempt %d: killed during the catch-up: %v", attempt, landed)
	}
	require.True(t, landed, "a kill landed during the catch-up after a restore")

	s = startServer(t, data, np, hp)
	require.Equal(t, before, caughtUpDigest(t, s), "the restored views, caught up after the kill, are the ones serve had")
	require.NotContains(t, s.Log.String(), "views: restoring", "views that are there (restored, partly caught up) are not restored again")
	out, code = s.run(t, "verify", "--json")
	require.Equal(t, 0, code, out)
}
