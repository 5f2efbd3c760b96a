package ledger_test

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

func attemptReq(c ledgertest.Call, notDone uint64) protocol.AttemptStartRequest {
	return protocol.AttemptStartRequest{ProjectID: c.Project, AgentTurnID: c.Turn, ToolCallID: c.ID, ExecutorID: "exec-a", NotDone: notDone, DeadlineUnixMS: 1_900_000_000_000}
}

// TestStartAttemptOnePerNumber: of concurrent starts of one call exactly
// one is told to run; the rest are told the attempt is open. A not_done
// moves to the next attempt once, and a stale one is answered open.
func TestStartAttemptOnePerNumber(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-1", ID: "call-1", Epoch: 1, Tool: "pay"}
	_, err := e.L.Dispatch(ctx, c.Dispatch())
	require.NoError(t, err)

	const n = 8
	results := make([]protocol.AttemptStartResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := e.L.StartAttempt(ctx, attemptReq(c, 0))
			require.NoError(t, err)
			results[i] = res
		})
	}
	wg.Wait()
	started := 0
	for _, r := range results {
		require.EqualValues(t, 1, r.Attempt)
		require.Equal(t, protocol.IdempotencyKey(c.Project, c.Turn, c.ID), r.IdempotencyKey)
		if r.Started {
			started++
		}
	}
	require.Equal(t, 1, started, "exactly one start runs the tool")

	// Concurrent not_done of attempt 1: attempt 2 is stored once.
	started = 0
	var mu sync.Mutex
	for range n {
		wg.Go(func() {
			res, err := e.L.StartAttempt(ctx, attemptReq(c, 1))
			require.NoError(t, err)
			require.EqualValues(t, 2, res.Attempt)
			mu.Lock()
			if res.Started {
				started++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Equal(t, 1, started)

	var atts []protocol.AttemptEntry
	_, err = e.L.ReadEntries(ctx, 1, func(en protocol.Entry) error {
		if en.Headers[protocol.HeaderEntryKind] != nil && en.Headers[protocol.HeaderEntryKind][0] == string(protocol.KindAttempt) {
			var a protocol.AttemptEntry
			require.NoError(t, json.Unmarshal(en.Data, &a))
			atts = append(atts, a)
		}
		return nil
	})
	require.NoError(t, err)
	require.Len(t, atts, 2, "one entry per attempt number")
	require.Equal(t, protocol.AttemptEntry{ProjectID: "proj", ChannelID: "main", AgentID: "agent", AgentTurnID: "turn-1", ToolCallID: "call-1", ToolName: "pay",
		Attempt: 2, ExecutorID: "exec-a", IdempotencyKey: protocol.IdempotencyKey("proj", "turn-1", "call-1"), DeadlineUnixMS: 1_900_000_000_000,
		PreviousOutcome: protocol.AttemptNotDone}, atts[1])

	// After the report, no attempt may start.
	_, err = e.L.PutCard(ctx, c.ResultCard(protocol.StatusSuccess, `{}`))
	require.NoError(t, err)
	_, err = e.L.Report(ctx, c.Report(protocol.StatusSuccess))
	require.NoError(t, err)
	_, err = e.L.StartAttempt(ctx, attemptReq(c, 2))
	require.ErrorIs(t, err, protocol.ErrConflict)
}

// TestStartAttemptRefusals: a bad body lists every violation; a call never
// dispatched, or not_done of an attempt that does not exist, is refused.
func TestStartAttemptRefusals(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	_, err := e.L.StartAttempt(ctx, protocol.AttemptStartRequest{ProjectID: "p p", DeadlineUnixMS: -1})
	le, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeBadRequest, le.Code)
	fields := map[string]bool{}
	for _, v := range le.Violations {
		fields[v.Field] = true
	}
	require.Equal(t, map[string]bool{"body.project_id": true, "body.agent_turn_id": true, "body.tool_call_id": true, "body.executor_id": true, "body.deadline_unix_ms": true}, fields)

	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-1", ID: "call-1", Epoch: 1, Tool: "pay"}
	_, err = e.L.StartAttempt(ctx, attemptReq(c, 0))
	require.ErrorIs(t, err, protocol.ErrUnknownCall)
	_, err = e.L.Dispatch(ctx, c.Dispatch())
	require.NoError(t, err)
	_, err = e.L.StartAttempt(ctx, attemptReq(c, 3))
	require.ErrorIs(t, err, protocol.ErrMismatch)

	// A report claiming an attempt outcome for a call with no attempt.
	_, err = e.L.PutCard(ctx, c.ResultCard(protocol.StatusSuccess, `{}`))
	require.NoError(t, err)
	rep := c.Report(protocol.StatusSuccess)
	rep.Payload.AttemptOutcome = protocol.AttemptReconciled
	_, err = e.L.Report(ctx, rep)
	require.ErrorIs(t, err, protocol.ErrMismatch)

	// A tool registered pure (or idempotent) records no attempt: one on
	// record would turn its deadline into outcome_unknown.
	_, err = e.L.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: "proj", ToolName: "lookup", Description: "reads",
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.lookup", AfterExecution: protocol.AfterSuspend,
		Parameters: json.RawMessage(`{"type":"object"}`), Determinism: protocol.DeterminismPure})
	require.NoError(t, err)
	p := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-1", ID: "call-pure", Epoch: 1, Tool: "lookup"}
	_, err = e.L.Dispatch(ctx, p.Dispatch())
	require.NoError(t, err)
	_, err = e.L.StartAttempt(ctx, attemptReq(p, 0))
	le, ok = protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeConflict, le.Code, "%+v", le)
	require.NotZero(t, le.Seq, "the refusal is recorded")
}
