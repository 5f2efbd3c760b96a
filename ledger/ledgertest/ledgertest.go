// Package ledgertest builds real ledgers for tests of the packages above the
// ledger (projector, executor, end-to-end): an embedded JetStream server, a
// Ledger on it, and scripted scenarios of calls, reports, duplicates and
// refusals.
package ledgertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// Env is a running embedded server with a ledger on it.
type Env struct {
	Srv *natstest.Server
	NC  *nats.Conn
	JS  jetstream.JetStream
	L   *ledger.Ledger
}

// New starts a server and opens a ledger; both end with the test.
func New(tb testing.TB) *Env {
	tb.Helper()
	return NewWithConfig(tb, ledger.Config{})
}

// NewWithConfig is New with the ledger opened with cfg (a retention
// window, for one).
func NewWithConfig(tb testing.TB, cfg ledger.Config) *Env {
	tb.Helper()
	return newEnv(tb, cfg)
}

// NewAuth is New on a server with credentials on: the Env's connection is
// the ledger's own, and Srv.Issue signs credentials for clients.
func NewAuth(tb testing.TB) *Env {
	tb.Helper()
	return newEnv(tb, ledger.Config{}, natstest.WithAuth())
}

func newEnv(tb testing.TB, cfg ledger.Config, opts ...natstest.Option) *Env {
	tb.Helper()
	srv := natstest.Start(tb, opts...)
	nc := srv.Connect(tb)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("ledgertest: jetstream: %v", err)
	}
	l, err := ledger.Open(Ctx(tb), nc, cfg)
	if err != nil {
		tb.Fatalf("ledgertest: open ledger: %v", err)
	}
	tb.Cleanup(l.Close)
	return &Env{Srv: srv, NC: nc, JS: js, L: l}
}

// Ctx is a context bounded by a minute and by the test.
func Ctx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// Call names one tool call of the scenarios.
type Call struct {
	Project, Channel, Agent, Turn, ID string
	Epoch                             uint64
	Tool                              string
}

// CardID is the call's tool.call card id.
func (c Call) CardID() string { return "cc-" + c.Turn + "-" + c.ID }

// ResultCardID is the id of the call's tool.result card with status.
func (c Call) ResultCardID(status string) string { return "rc-" + c.Turn + "-" + c.ID + "-" + status }

// Meta is the lineage metadata of the call's cards.
func (c Call) Meta() protocol.CardMetadata {
	return protocol.CardMetadata{TraceID: "trace-" + c.Turn, ParentStepID: "parent-" + c.ID, StepID: "step-" + c.ID}
}

// Identity is the call's control identity.
func (c Call) Identity() protocol.Identity {
	return protocol.Identity{AgentID: c.Agent, AgentTurnID: c.Turn, TurnEpoch: c.Epoch, ToolCallID: c.ID}
}

// Dispatch is the call's dispatch request.
func (c Call) Dispatch() protocol.DispatchRequest {
	return protocol.DispatchRequest{
		Subject:  protocol.ToolCommandSubject("v1", c.Project, c.Channel, c.Tool),
		Identity: c.Identity(),
		Card: protocol.Card{
			CardID: c.CardID(), ProjectID: c.Project, Type: protocol.CardToolCall, AuthorID: c.Agent,
			AgentTurnID: c.Turn, ToolCallID: c.ID,
			Content:  json.RawMessage(fmt.Sprintf(`{"tool_name":%q,"arguments":{"q":%q}}`, c.Tool, c.ID)),
			Metadata: c.Meta(),
		},
		Payload: protocol.ToolCommandPayload{ToolCallCardID: c.CardID(), ToolName: c.Tool, AfterExecution: protocol.AfterSuspend},
	}
}

// ResultCard is the call's tool.result card with status; result may carry a
// __cg_control override.
func (c Call) ResultCard(status string, result string) protocol.Card {
	content := fmt.Sprintf(`{"status":%q,"result":%s}`, status, result)
	if status == protocol.StatusFailed || status == protocol.StatusTimeout {
		content = fmt.Sprintf(`{"status":%q,"result":%s,"error":{"code":"internal_error","message":"boom"}}`, status, result)
	}
	return protocol.Card{
		CardID: c.ResultCardID(status), ProjectID: c.Project, Type: protocol.CardToolResult,
		AuthorID: "tool." + c.Tool, FunctionName: c.Tool, AgentTurnID: c.Turn, ToolCallID: c.ID,
		Content: json.RawMessage(content), Metadata: c.Meta(),
	}
}

// Report is the report of the call's result card with status.
func (c Call) Report(status string) protocol.ReportRequest {
	return protocol.ReportRequest{
		ProjectID: c.Project, ChannelID: c.Channel, Identity: c.Identity(),
		SourceID: "tool." + c.Tool, SourceFunction: c.Tool,
		Payload: protocol.ReportPayload{Status: status, AfterExecution: protocol.AfterSuspend, ToolResultCardID: c.ResultCardID(status)},
	}
}

// Complete dispatches the call, stores its result card and reports it.
func (e *Env) Complete(tb testing.TB, c Call, status, result string) protocol.ReportOutcome {
	tb.Helper()
	ctx := Ctx(tb)
	if _, err := e.L.Dispatch(ctx, c.Dispatch()); err != nil {
		tb.Fatalf("ledgertest: dispatch %s: %v", c.ID, err)
	}
	if _, err := e.L.PutCard(ctx, c.ResultCard(status, result)); err != nil {
		tb.Fatalf("ledgertest: result card %s: %v", c.ID, err)
	}
	out, err := e.L.Report(ctx, c.Report(status))
	if err != nil {
		tb.Fatalf("ledgertest: report %s: %v", c.ID, err)
	}
	return out
}

// Scenario writes a varied multi-agent ledger: rosters, successful and
// failed calls, a __cg_control override, duplicates, a conflict, a stale
// epoch, an unknown card, a rejected dispatch, consumed results and a
// pending one. calls scales the number of plain successful calls.
func (e *Env) Scenario(tb testing.TB, calls int) {
	tb.Helper()
	ctx := Ctx(tb)
	must := func(err error, what string) {
		tb.Helper()
		if err != nil {
			tb.Fatalf("ledgertest: scenario: %s: %v", what, err)
		}
	}
	refused := func(err error, want error, what string) {
		tb.Helper()
		if !errors.Is(err, want) {
			tb.Fatalf("ledgertest: scenario: %s: want %v, got %v", what, want, err)
		}
	}
	for _, a := range []string{"alice", "bob"} {
		_, err := e.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: a, WorkerTarget: "worker-" + a})
		must(err, "roster")
	}
	for i := range calls {
		agent := []string{"alice", "bob"}[i%2]
		tool := []string{"search", "echo", "fetch"}[i%3]
		c := Call{Project: "proj", Channel: "main", Agent: agent, Turn: fmt.Sprintf("turn-%s-%d", agent, i/4), ID: fmt.Sprintf("call-%d", i), Epoch: 1, Tool: tool}
		status := protocol.StatusSuccess
		if i%5 == 4 {
			status = protocol.StatusFailed
		}
		e.Complete(tb, c, status, `{"n":1}`)
		if i%3 == 0 {
			_, err := e.L.Consume(ctx, protocol.ConsumeRequest{ProjectID: c.Project, AgentID: c.Agent, AgentTurnID: c.Turn, ToolCallID: c.ID})
			must(err, "consume")
		}
	}
	ov := Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "turn-special", ID: "override", Epoch: 3, Tool: "search"}
	e.Complete(tb, ov, protocol.StatusSuccess, `{"hits":2,"__cg_control":{"after_execution":"terminate"}}`)
	_, err := e.L.Report(ctx, ov.Report(protocol.StatusSuccess))
	must(err, "duplicate")
	stale := ov
	stale.Epoch = 2
	_, err = e.L.Report(ctx, stale.Report(protocol.StatusSuccess))
	refused(err, protocol.ErrStaleEpoch, "stale epoch")
	_, err = e.L.PutCard(ctx, ov.ResultCard(protocol.StatusFailed, `null`))
	must(err, "second result card")
	_, err = e.L.Report(ctx, ov.Report(protocol.StatusFailed))
	refused(err, protocol.ErrConflict, "conflict")

	pending := Call{Project: "proj", Channel: "main", Agent: "bob", Turn: "turn-special", ID: "pending", Epoch: 3, Tool: "fetch"}
	_, err = e.L.Dispatch(ctx, pending.Dispatch())
	must(err, "dispatch pending")
	_, err = e.L.Report(ctx, pending.Report(protocol.StatusSuccess))
	refused(err, protocol.ErrUnknownCard, "unknown card")

	bad := Call{Project: "proj", Channel: "main", Agent: "bob", Turn: "turn-special", ID: "bad", Epoch: 3, Tool: "fetch"}
	req := bad.Dispatch()
	req.Payload.AfterExecution = "later"
	_, err = e.L.Dispatch(ctx, req)
	refused(err, protocol.ErrBadRequest, "bad dispatch")
}
