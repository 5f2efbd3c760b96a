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
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
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
	return newEnvWith(t, ledger.Config{}, opts...)
}

// newEnvWith is newEnv with the ledger opened with cfg (its Registerer
// set here).
func newEnvWith(t testing.TB, cfg ledger.Config, opts ...natstest.Option) *env {
	t.Helper()
	srv := natstest.Start(t, opts...)
	nc := srv.Connect(t)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	l, err := ledger.Open(ctxT(t), nc, cfg)
	require.NoError(t, err)
	return &env{srv: srv, nc: nc, l: l, reg: reg}
}

type call struct {
	turn, id string
	epoch    uint64
	card     protocol.Card
	meta     protocol.CardMetadata
}

func newCall(turn, id string, epoch uint64) call {
	meta := protocol.CardMetadata{TraceID: "trace-" + turn, ParentStepID: "parent-" + id, StepID: "step-" + id}
	return call{turn: turn, id: id, epoch: epoch, meta: meta, card: protocol.Card{
		CardID: "cc-" + turn + "-" + id, ProjectID: project, Type: protocol.CardToolCall, AuthorID: agent,
		AgentTurnID: turn, ToolCallID: id,
		Content:  json.RawMessage(`{"tool_name":"echo","arguments":{"text":"hi"}}`),
		Metadata: meta,
	}}
}

func (c call) identity() protocol.Identity {
	return protocol.Identity{AgentID: agent, AgentTurnID: c.turn, TurnEpoch: c.epoch, ToolCallID: c.id}
}

func (c call) dispatchReq() protocol.DispatchRequest {
	return protocol.DispatchRequest{
		Subject:  protocol.ToolCommandSubject("v1", project, channel, "echo"),
		Identity: c.identity(),
		Card:     c.card,
		Payload:  protocol.ToolCommandPayload{ToolCallCardID: c.card.CardID, ToolName: "echo", AfterExecution: protocol.AfterSuspend},
	}
}

func (c call) resultCard(status string) protocol.Card {
	content := fmt.Sprintf(`{"status":%q,"result":{"text":"hi"}}`, status)
	if status != protocol.StatusSuccess {
		content = fmt.Sprintf(`{"status":%q,"result":null,"error":{"code":"internal_error","message":"boom"}}`, status)
	}
	return protocol.Card{
		CardID: "rc-" + c.turn + "-" + c.id + "-" + status, ProjectID: project, Type: protocol.CardToolResult,
		AuthorID: source, FunctionName: toolFn, AgentTurnID: c.turn, ToolCallID: c.id,
		Content: json.RawMessage(content), Metadata: c.meta,
	}
}

func (c call) reportReq(status, cardID string) protocol.ReportRequest {
	return protocol.ReportRequest{
		ProjectID: project, ChannelID: channel, Identity: c.identity(),
		SourceID: source, SourceFunction: toolFn,
		Payload: protocol.ReportPayload{Status: status, AfterExecution: protocol.AfterSuspend, ToolResultCardID: cardID},
	}
}

// dispatchAndResult dispatches c and stores its result card.
func (e *env) dispatchAndResult(t testing.TB, c call, status string) protocol.Card {
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
	info, err := js.StreamInfo(stream.DefaultName, &nats.StreamInfoRequest{SubjectsFilter: filter})
	require.NoError(t, err)
	var total uint64
	for _, n := range info.State.Subjects {
		total += n
	}
	if total == 0 {
		return nil
	}
	sub, err := js.SubscribeSync(filter, nats.OrderedConsumer(), nats.BindStream(stream.DefaultName))
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
