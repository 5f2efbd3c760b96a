package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// consumerSeries is one consumer's gauges from a scrape: by family, the
// tool label and the value.
type consumerSeries map[string]struct {
	tool  string
	value float64
}

// scrapeConsumers gathers the jetStreamCollector's consumer gauges, by
// consumer name.
func scrapeConsumers(t *testing.T, reg *prometheus.Registry) map[string]consumerSeries {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]consumerSeries{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			name, ok := labels["consumer"]
			if !ok {
				continue
			}
			if out[name] == nil {
				out[name] = consumerSeries{}
			}
			out[name][mf.GetName()] = struct {
				tool  string
				value float64
			}{labels["tool"], m.GetGauge().GetValue()}
		}
	}
	return out
}

// TestConsumerGaugesAreLabelledByTool: the built-in executor's consumer is
// labelled with its tool, a tool service's consumer (tool.consumer, named
// by a hash) with the registered tool, a consumer of several tools _any,
// the deadline keeper's _none; waiting pulls tell the consumer someone
// pulls from the one nobody does, whose command stays pending.
func TestConsumerGaugesAreLabelledByTool(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	l, err := ledger.Open(ctx, nc, ledger.Config{BuiltinTools: []protocol.ToolDefinition{*executor.EchoDefinition, *executor.SleepDefinition}})
	require.NoError(t, err)
	t.Cleanup(l.Close)

	ex, err := executor.New(l, nc, executor.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, executor.RegisterBuiltins(ex))
	require.NoError(t, ex.Start(ctx))
	t.Cleanup(func() { ex.Stop(context.Background()) })
	keeper, err := l.StartDeadlineKeeper(ctx, ledger.DeadlineKeeperConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = keeper.Stop(context.Background()) })

	_, err = l.RegisterTool(ctx, &protocol.ToolDefinition{ProjectID: "proj", ToolName: "search", Parameters: json.RawMessage(`{"type":"object"}`),
		TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.search", AfterExecution: protocol.AfterSuspend})
	require.NoError(t, err)
	svc, err := l.EnsureToolConsumer(ctx, "proj", "search")
	require.NoError(t, err)
	_, err = js.CreateOrUpdateConsumer(ctx, l.StreamName(), jetstream.ConsumerConfig{Durable: "several",
		FilterSubjects: []string{protocol.ToolCommandSubject("v1", "proj", "*", "search"), protocol.ToolCommandSubject("v1", "proj", "*", "echo")}})
	require.NoError(t, err)

	// A call for search, which no service pulls.
	card := protocol.Card{CardID: "cc-1", ProjectID: "proj", Type: protocol.CardToolCall, AuthorID: "agent", AgentTurnID: "turn", ToolCallID: "c1",
		Content: json.RawMessage(`{"tool_name":"search","arguments":{}}`)}
	_, err = l.Dispatch(ctx, protocol.DispatchRequest{Subject: protocol.ToolCommandSubject("v1", "proj", "main", "search"),
		Identity: protocol.Identity{AgentID: "agent", AgentTurnID: "turn", TurnEpoch: 1, ToolCallID: "c1"}, Card: card,
		Payload: protocol.ToolCommandPayload{ToolCallCardID: card.CardID, ToolName: "search", AfterExecution: protocol.AfterSuspend}})
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	reg.MustRegister(&jetStreamCollector{js: js, labels: l.ToolLabels(), streams: []string{l.StreamName()}})
	echo := "cgledger-tool-" + "echo"
	deadline := ledger.DefaultDeadlineDurable + "v1"
	var got map[string]consumerSeries
	require.Eventually(t, func() bool {
		got = scrapeConsumers(t, reg)
		return got[echo]["cgledger_consumer_waiting_pulls"].value > 0 && got[svc.Consumer]["cgledger_consumer_pending_messages"].value == 1
	}, time.Minute, 20*time.Millisecond, "the executor pulls; the search command waits")
	want := map[string]string{echo: "echo", "cgledger-tool-" + "sleep": "sleep", svc.Consumer: "search", "several": "_any", deadline: "_none"}
	for name, tool := range want {
		require.Len(t, got[name], 5, "every gauge of %s: %v", name, got[name])
		for family, s := range got[name] {
			require.Equal(t, tool, s.tool, "%s{consumer=%q}", family, name)
		}
	}
	require.Len(t, got, len(want), "%v", got)
	require.Zero(t, got[svc.Consumer]["cgledger_consumer_waiting_pulls"].value, "nobody pulls search")
	require.GreaterOrEqual(t, got[svc.Consumer]["cgledger_consumer_idle_seconds"].value, 0.0)
}

// TestConsumerIdleSeconds: from the latest of creation, last delivery and
// last acknowledgement to the server's time of the info.
func TestConsumerIdleSeconds(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) *time.Time { v := t0.Add(time.Duration(s) * time.Second); return &v }
	info := &jetstream.ConsumerInfo{Created: t0, TimeStamp: *at(10)}
	require.Equal(t, 10.0, consumerIdleSeconds(info), "never delivered: since creation")
	info.Delivered.Last = at(5)
	require.Equal(t, 5.0, consumerIdleSeconds(info))
	info.AckFloor.Last = at(7)
	require.Equal(t, 3.0, consumerIdleSeconds(info), "an ack is activity")
	info.Delivered.Last = at(9)
	require.Equal(t, 1.0, consumerIdleSeconds(info))
}

// TestConsumerToolLabel: the label rules on filter subjects alone.
func TestConsumerToolLabel(t *testing.T) {
	labels := toollabels.New("echo", "search")
	for _, c := range []struct {
		filters []string
		want    string
	}{
		{[]string{"cg.*.*.*.cmd.tool.echo", "cg.*.*.*.cmd.tool.echo.>"}, "echo"},
		{[]string{"cg.v1.p.*.cmd.tool.search"}, "search"},
		{[]string{"cg.v1.p.*.cmd.tool.madeup"}, toollabels.Other},
		{[]string{"cg.v1.p.*.cmd.tool.search", "cg.v1.p.*.cmd.tool.echo"}, "_any"},
		{[]string{"cg.v1.*.*.cmd.tool.>"}, "_any"},
		{[]string{"cg.v1.*.*.cmd.tool.>", "cg.v1.*.*.ledger.prepared.*.*"}, "_none"},
		{[]string{">"}, "_none"},
		{nil, "_none"},
	} {
		require.Equal(t, c.want, consumerTool(labels, c.filters), "%v", c.filters)
	}
}
