package ledger

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/protocol"
)

// TestToolCallsMetricKnowsTheErrorCodeOfAnOldClaim: a record written by an
// earlier version holds the claim (the entry's bytes) but never its error
// code; the report that appends that claim reads the code from the result
// card, so the call counts under its real error_code, not "none".
func TestToolCallsMetricKnowsTheErrorCodeOfAnOldClaim(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Start(t)
	reg := prometheus.NewRegistry()
	l, err := Open(ctx, srv.Connect(t), Config{Registerer: reg})
	require.NoError(t, err)
	t.Cleanup(l.Close)
	l.labels.AddBuiltin("echo")

	id := protocol.Identity{AgentID: "agent", AgentTurnID: "turn-old", TurnEpoch: 1, ToolCallID: "c1"}
	meta := protocol.CardMetadata{TraceID: "tr", ParentStepID: "ps", StepID: "st"}
	call := protocol.Card{CardID: "cc-old", ProjectID: "proj", Type: protocol.CardToolCall, AuthorID: "agent", AgentTurnID: id.AgentTurnID, ToolCallID: id.ToolCallID,
		Content: json.RawMessage(`{"tool_name":"echo","arguments":{}}`), Metadata: meta}
	_, err = l.Dispatch(ctx, protocol.DispatchRequest{Subject: protocol.ToolCommandSubject("v1", "proj", "main", "echo"), Identity: id, Card: call,
		Payload: protocol.ToolCommandPayload{ToolCallCardID: call.CardID, ToolName: "echo", AfterExecution: protocol.AfterSuspend}})
	require.NoError(t, err)
	result := protocol.Card{CardID: "rc-old", ProjectID: "proj", Type: protocol.CardToolResult, AuthorID: "tool.echo", FunctionName: "echo",
		AgentTurnID: id.AgentTurnID, ToolCallID: id.ToolCallID, Metadata: meta,
		Content: json.RawMessage(`{"status":"failed","result":null,"error":{"code":"auth_failed","message":"no"}}`)}
	_, err = l.PutCard(ctx, result)
	require.NoError(t, err)
	req := protocol.ReportRequest{ProjectID: "proj", ChannelID: "main", Identity: id, SourceID: "tool.echo", SourceFunction: "echo",
		Payload: protocol.ReportPayload{Status: protocol.StatusFailed, AfterExecution: protocol.AfterSuspend, ToolResultCardID: result.CardID}}

	// The record as an earlier version left it: claimed, the claim's
	// bytes kept, the entry not yet appended.
	key := callKey("proj", id.AgentTurnID, id.ToolCallID)
	rec, rev, err := l.getRecord(ctx, key)
	require.NoError(t, err)
	sc, err := l.GetCard(ctx, "proj", result.CardID)
	require.NoError(t, err)
	in := &reportInput{project: "proj", channel: "main", id: id, sourceID: req.SourceID, sourceFunction: req.SourceFunction, payload: req.Payload}
	fp := reportFingerprint(req.Payload.Status, req.Payload.AfterExecution, result.CardID, "", req.SourceID, req.SourceFunction, "")
	claim, err := l.buildClaim(rec, in, fp, sc, nil)
	require.NoError(t, err)
	require.Equal(t, protocol.ErrorCodeAuthFailed, claim.ErrorCode)
	old := cloneRecord(rec)
	old.State = protocol.StateClaimed
	stored, err := json.Marshal(claim)
	require.NoError(t, err)
	old.Claim = &protocol.Claim{}
	require.NoError(t, json.Unmarshal(stored, old.Claim), "as persisted")
	require.Empty(t, old.Claim.ErrorCode, "never persisted")
	_, ok, err := l.updateRecord(ctx, key, old, rev)
	require.NoError(t, err)
	require.True(t, ok)

	out, err := l.Report(ctx, req)
	require.NoError(t, err)
	require.False(t, out.Duplicate, "this report appended the old claim")
	require.Equal(t, 1.0, testutil.ToFloat64(l.m.toolCalls.WithLabelValues("echo", protocol.StatusFailed, protocol.ErrorCodeAuthFailed)))
	require.Equal(t, 1, testutil.CollectAndCount(l.m.toolCalls), "counted once, under its code")
}
