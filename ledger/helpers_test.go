package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
)

const (
	project = "proj-1"
	channel = "chan-1"
	agent   = "agent-1"
	source  = "tool.echo"
	toolFn  = "echo"
)

type env struct {
	srv *natstest.Server
	nc  *nats.Conn
	l   *ledger.Ledger
	reg *prometheus.Registry
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newEnv(t testing.TB, opts ...natstest.Option) *env {
	t.Helper()
	srv := natstest.Start(t, opts...)
	nc := srv.Connect(t)
	reg := prometheus.NewRegistry()
	l, err := ledger.Open(ctxT(t), nc, ledger.Config{Registerer: reg})
	require.NoError(t, err)
	return &env{srv: srv, nc: nc, l: l, reg: reg}
}

type call struct {
	turn, id string
	epoch    uint64
	card     ledger.Card
	meta     ledger.CardMetadata
}

func newCall(turn, id string, epoch uint64) call {
	meta := ledger.CardMetadata{TraceID: "trace-" + turn, ParentStepID: "parent-" + id, StepID: "step-" + id}
	return call{turn: turn, id: id, epoch: epoch, meta: meta, card: ledger.Card{
		CardID: "cc-" + turn + "-" + id, ProjectID: project, Type: ledger.CardToolCall, AuthorID: agent,
		AgentTurnID: turn, ToolCallID: id,
		Content:  json.RawMessage(`{"tool_name":"echo","arguments":{"text":"hi"}}`),
		Metadata: meta,
	}}
}

func (c call) identity() ledger.Identity {
	return ledger.Identity{AgentID: agent, AgentTurnID: c.turn, TurnEpoch: c.epoch, ToolCallID: c.id}
}

func (c call) dispatchReq() ledger.DispatchRequest {
	return ledger.DispatchRequest{
		Subject:  ledger.ToolCommandSubject("v1", project, channel, "echo"),
		Identity: c.identity(),
		Card:     c.card,
		Payload:  ledger.ToolCommandPayload{ToolCallCardID: c.card.CardID, ToolName: "echo", AfterExecution: ledger.AfterSuspend},
	}
}

func (c call) resultCard(status string) ledger.Card {
	content := fmt.Sprintf(`{"status":%q,"result":{"text":"hi"}}`, status)
	if status != ledger.StatusSuccess {
		content = fmt.Sprintf(`{"status":%q,"result":null,"error":{"code":"internal_error","message":"boom"}}`, status)
	}
	return ledger.Card{
		CardID: "rc-" + c.turn + "-" + c.id + "-" + status, ProjectID: project, Type: ledger.CardToolResult,
		AuthorID: source, FunctionName: toolFn, AgentTurnID: c.turn, ToolCallID: c.id,
		Content: json.RawMessage(content), Metadata: c.meta,
	}
}

func (c call) reportReq(status, cardID string) ledger.ReportRequest {
	return ledger.ReportRequest{
		ProjectID: project, ChannelID: channel, Identity: c.identity(),
		SourceID: source, SourceFunction: toolFn,
		Payload: ledger.ReportPayload{Status: status, AfterExecution: ledger.AfterSuspend, ToolResultCardID: cardID},
	}
}

// dispatchAndResult dispatches c and stores its result card.
func (e *env) dispatchAndResult(t testing.TB, c call, status string) ledger.Card {
	t.Helper()
	ctx := ctxT(t)
	_, err := e.l.Dispatch(ctx, c.dispatchReq())
	require.NoError(t, err)
	rc := c.resultCard(status)
	_, err = e.l.PutCard(ctx, rc)
	require.NoError(t, err)
	return rc
}

// subjectEntries returns every entry stored on subjects matching filter.
func (e *env) subjectEntries(t testing.TB, filter string) []*nats.Msg {
	t.Helper()
	js, err := e.nc.JetStream()
	require.NoError(t, err)
	info, err := js.StreamInfo(ledger.DefaultStream, &nats.StreamInfoRequest{SubjectsFilter: filter})
	require.NoError(t, err)
	var total uint64
	for _, n := range info.State.Subjects {
		total += n
	}
	if total == 0 {
		return nil
	}
	sub, err := js.SubscribeSync(filter, nats.OrderedConsumer(), nats.BindStream(ledger.DefaultStream))
	require.NoError(t, err)
	defer sub.Unsubscribe()
	var out []*nats.Msg
	for uint64(len(out)) < total {
		m, err := sub.NextMsg(10 * time.Second)
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}
