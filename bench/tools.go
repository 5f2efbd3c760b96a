package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
)

// The bench's external tool service and its report-only target. Neither is
// served by the executor: "bext" by a service in the load generator speaking
// the wire protocol, "brep" by nobody (its calls are reported directly).
const (
	extTool    = "bext"
	reportTool = "brep"
	// sideEffectTool is echo registered as side_effectful: the
	// built-in echo runs it, after recording its attempt (attempt.start),
	// so its row beside e2e echo is the price of the intent entry.
	sideEffectTool = "echo_se"
)

// errPoolEmpty ends a caller of the report workload: every prepared call has
// been reported.
var errPoolEmpty = errors.New("bench: prepared calls used up")

// toolWorkload is the external tool service and the report-only workload.
type toolWorkload struct {
	e      *env
	ext    *client.Client // the service's tool credential (target bext)
	rep    *client.Client // tool credential of target brep
	cc     jetstream.ConsumeContext
	mu     sync.Mutex
	pool   []protocol.ReportRequest
	closer []func()
}

// newToolWorkload registers both tools, connects their credentials and starts
// the external service: pull the durable consumer tool.consumer names, read
// the tool.call card, store the result card and the report with one
// report.result, ack (protocol.md, "A tool service, step by step").
func newToolWorkload(ctx context.Context, e *env, connect func(auth.Grant) (*nats.Conn, error)) (*toolWorkload, error) {
	admin := client.New(e.admin)
	for _, name := range []string{extTool, reportTool} {
		def := fmt.Sprintf(`{"tool_name":%q,"parameters":{"type":"object"},"target_subject":%q,"after_execution":"suspend"}`, name, protocol.ToolTargetTemplate(name))
		if _, err := admin.RegisterToolYAML(ctx, "bench", []byte(def)); err != nil {
			return nil, fmt.Errorf("register %s: %w", name, err)
		}
	}
	se := `{"tool_name":"` + sideEffectTool + `","parameters":{"type":"object"},"target_subject":"` + protocol.ToolTargetTemplate("echo", "se") + `","after_execution":"suspend","determinism":"side_effectful"}`
	if _, err := admin.RegisterToolYAML(ctx, "bench", []byte(se)); err != nil {
		return nil, fmt.Errorf("register %s: %w", sideEffectTool, err)
	}
	t := &toolWorkload{e: e}
	svc, err := connect(auth.Grant{Role: auth.RoleTool, Project: "bench", Tool: extTool})
	if err != nil {
		return nil, fmt.Errorf("connect the tool service: %w", err)
	}
	t.closer = append(t.closer, svc.Close)
	rep, err := connect(auth.Grant{Role: auth.RoleTool, Project: "bench", Tool: reportTool})
	if err != nil {
		t.close()
		return nil, fmt.Errorf("connect the report caller: %w", err)
	}
	t.closer = append(t.closer, rep.Close)
	t.ext = client.New(svc, client.WithActor(extTool))
	t.rep = client.New(rep, client.WithActor(reportTool))
	ci, err := t.ext.EnsureToolConsumer(ctx, "bench", extTool)
	if err != nil {
		t.close()
		return nil, fmt.Errorf("tool.consumer: %w", err)
	}
	js, err := jetstream.NewWithAPIPrefix(svc, ci.APIPrefix)
	if err != nil {
		t.close()
		return nil, err
	}
	cons, err := js.Consumer(ctx, ci.Stream, ci.Consumer)
	if err != nil {
		t.close()
		return nil, fmt.Errorf("bind %s: %w", ci.Consumer, err)
	}
	if t.cc, err = cons.Consume(func(m jetstream.Msg) { go t.serve(m) }, jetstream.PullMaxMessages(512)); err != nil {
		t.close()
		return nil, fmt.Errorf("consume %s: %w", ci.Consumer, err)
	}
	t.closer = append(t.closer, t.cc.Stop)
	return t, nil
}

func (t *toolWorkload) close() {
	for i := len(t.closer) - 1; i >= 0; i-- {
		t.closer[i]()
	}
}

// serve runs one command as a tool service in another language would.
func (t *toolWorkload) serve(m jetstream.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cmd protocol.ToolCommandPayload
	h := m.Headers()
	toks := strings.Split(m.Subject(), ".")
	if json.Unmarshal(m.Data(), &cmd) != nil || len(toks) < 4 {
		_ = m.Term()
		return
	}
	project, channel := toks[2], toks[3]
	cards, _, err := t.ext.GetCards(ctx, project, []string{cmd.ToolCallCardID})
	if err != nil || len(cards) != 1 {
		_ = m.Nak()
		return
	}
	call := cards[0].Card
	id := protocol.Identity{AgentID: h.Get(protocol.HeaderAgentID), AgentTurnID: h.Get(protocol.HeaderAgentTurnID), ToolCallID: h.Get(protocol.HeaderToolCallID)}
	id.TurnEpoch, _ = strconv.ParseUint(h.Get(protocol.HeaderTurnEpoch), 10, 64)
	// One request for the card and the report (report.result).
	card, req := resultOf(extTool, project, channel, id, call)
	if _, err := t.ext.ReportResult(ctx, card, req); err != nil {
		_ = m.Nak()
		return
	}
	_ = m.Ack()
}

// resultOf is the tool.result card for call and the report that goes with it.
func resultOf(tool, project, channel string, id protocol.Identity, call protocol.Card) (protocol.Card, protocol.ReportRequest) {
	card := protocol.Card{CardID: "rc-" + call.ToolCallID, ProjectID: project, Type: protocol.CardToolResult, AuthorID: "svc." + tool,
		FunctionName: tool, AgentTurnID: call.AgentTurnID, ToolCallID: call.ToolCallID,
		Content: json.RawMessage(`{"status":"success","result":{"text":"bench"}}`), Metadata: call.Metadata}
	return card, protocol.ReportRequest{ProjectID: project, ChannelID: channel, SourceID: "svc." + tool, SourceFunction: tool, Identity: id,
		Payload: protocol.ReportPayload{Status: protocol.StatusSuccess, AfterExecution: protocol.AfterSuspend, ToolResultCardID: card.CardID}}
}

// result puts the tool.result card for call (card.put) and returns the
// report that goes with it: the report workload measures the report alone.
func (t *toolWorkload) result(ctx context.Context, cl *client.Client, tool, project, channel string, id protocol.Identity, call protocol.Card) (protocol.ReportRequest, error) {
	card, req := resultOf(tool, project, channel, id, call)
	if _, err := cl.PutCard(ctx, card); err != nil {
		return protocol.ReportRequest{}, fmt.Errorf("result card: %w", err)
	}
	return req, nil
}

// prepare dispatches n calls to the report-only tool and puts their result
// cards, n at a time in flight, so the report workload measures the report
// alone.
func (t *toolWorkload) prepare(ctx context.Context, n, inflight int) error {
	reqs := make([]protocol.ReportRequest, n)
	errs := make(chan error, inflight)
	sem := make(chan struct{}, inflight)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			turn, id := t.e.nextCall()
			card, err := t.e.dispatch(ctx, reportTool, turn, id)
			if err == nil {
				reqs[i], err = t.result(ctx, t.rep, reportTool, "bench", "main",
					protocol.Identity{AgentID: "agent", AgentTurnID: turn, TurnEpoch: 1, ToolCallID: id}, card)
			}
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("prepare calls to report: %w", err)
	default:
	}
	t.mu.Lock()
	t.pool = reqs
	t.mu.Unlock()
	return nil
}

// report sends the next prepared report.
func (t *toolWorkload) report(ctx context.Context) error {
	t.mu.Lock()
	if len(t.pool) == 0 {
		t.mu.Unlock()
		return errPoolEmpty
	}
	req := t.pool[len(t.pool)-1]
	t.pool = t.pool[:len(t.pool)-1]
	t.mu.Unlock()
	out, err := t.rep.Report(ctx, req)
	if err == nil && out.Duplicate {
		return errors.New("a first report was answered as a duplicate")
	}
	return err
}

// nextCall names a new call: its turn and tool call id.
func (e *env) nextCall() (string, string) {
	n := e.seq.Add(1)
	return "turn-" + strconv.FormatInt(n/100, 10), "call-" + strconv.FormatInt(n, 10)
}

// dispatch dispatches call id of turn to tool as a worker does and returns
// its tool.call card.
func (e *env) dispatch(ctx context.Context, tool, turn, id string) (protocol.Card, error) {
	sum := sha256.Sum256([]byte(turn + id))
	card := protocol.Card{CardID: "cc-" + id, ProjectID: "bench", Type: protocol.CardToolCall, AuthorID: "agent",
		AgentTurnID: turn, ToolCallID: id, Content: json.RawMessage(`{"tool_name":"` + tool + `","arguments":{"text":"bench"}}`),
		Metadata: protocol.CardMetadata{TraceID: hex.EncodeToString(sum[:16])}}
	_, err := e.cl.Dispatch(ctx, protocol.DispatchRequest{
		Subject:  protocol.ToolCommandSubject(protocol.DefaultVersion, "bench", "main", target(tool)...),
		Identity: protocol.Identity{AgentID: "agent", AgentTurnID: turn, TurnEpoch: 1, ToolCallID: id},
		Card:     card,
		Payload:  protocol.ToolCommandPayload{ToolCallCardID: card.CardID, ToolName: tool, AfterExecution: protocol.AfterSuspend},
	})
	return card, err
}

// target is the command subject's target tokens of a bench tool: its
// name, except the side_effectful echo, which the echo implementation
// serves under cmd.tool.echo.se.
func target(tool string) []string {
	if tool == sideEffectTool {
		return []string{"echo", "se"}
	}
	return []string{tool}
}
