package executor

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// Ledger is what the executor needs from the ledger. *ledger.Ledger
// provides it; every read is read-your-writes, so the executor never depends
// on a projection.
type Ledger interface {
	ReadExecutionInputs(ctx context.Context, q protocol.ExecutionQuery) protocol.ExecutionInputs
	GetCall(ctx context.Context, project, turnID, callID string) (*protocol.CallRecord, error)
	GetTool(ctx context.Context, project, tool string) (*protocol.StoredTool, error)
	PutCard(ctx context.Context, card protocol.Card) (protocol.PutCardResult, error)
	Report(ctx context.Context, req protocol.ReportRequest) (protocol.ReportOutcome, error)
	Resume(ctx context.Context, project, turnID, callID string) (protocol.ReportOutcome, error)
	RejectCommand(ctx context.Context, subject string, h nats.Header, data []byte, e *protocol.Error) error
}

// Config configures an Executor. Zero values mean the documented defaults.
type Config struct {
	// SourceID is the author_id of result cards and the CG-Source-Id of
	// reports. Empty means "cgledger.executor".
	SourceID string
	// Stream is the ledger stream. Empty means ledger.DefaultStream.
	Stream string
	// DurablePrefix names the durable consumers: prefix + implementation.
	// Empty means "cgledger-tool-". Executors sharing a prefix share the work.
	DurablePrefix string
	// AckWait is how long JetStream waits for an ack before redelivering,
	// and so how soon another executor takes over the calls of one that
	// died. Zero means 5s; running calls heartbeat every AckWait/3, so a
	// long call is never redelivered while its executor lives.
	AckWait time.Duration
	// MaxDeliver bounds how often a call's tool may run. Zero means 5. From
	// that delivery on the call is resolved as failed without running the
	// tool again. JetStream itself never drops a command (the consumer's
	// own limit is off): if the failure cannot be written (a full disk),
	// the command is redelivered until it can.
	MaxDeliver int
	// MaxInFlight bounds concurrently running calls. Zero means 64.
	MaxInFlight int
	// DrainTimeout bounds how long Stop waits for in-flight calls before
	// canceling them (they are nak'ed for another executor). Zero means 30s.
	DrainTimeout time.Duration
	// LookupEnv reads environment variables for options.envs and tool
	// credentials. Nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// EnvOverrides are service-side values that take priority over the
	// environment (seed 003: service configuration wins).
	EnvOverrides map[string]string
	// TracerProvider makes the calls' spans. Nil means OpenTelemetry's
	// global provider (a no-op unless the program sets one, as serve does
	// when OTEL_EXPORTER_OTLP_* is configured).
	TracerProvider trace.TracerProvider
	// Registerer receives the executor's metrics. Nil keeps them unregistered.
	Registerer prometheus.Registerer
	// Logger receives operational logs (never arguments or secrets). Nil
	// discards them.
	Logger *slog.Logger
	// CardIDKey keys the ids of result cards. With a secret key nobody else
	// can predict them, so no one who may put cards in a project can take a
	// result card's id first and make every delivery of a call fail. Empty
	// means unkeyed (predictable) ids: fine for tests and replays, not for a
	// server others can reach.
	CardIDKey []byte
}

// Executor runs tools for commands on the ledger stream.
type Executor struct {
	l   Ledger
	js  jetstream.JetStream
	nc  *nats.Conn
	cfg Config
	m   *metrics
	log *slog.Logger
	tp  trace.TracerProvider

	impls map[string]*impl

	mu       sync.Mutex
	stopping bool
	inflight map[string]context.CancelCauseFunc
	sems     map[string]toolSem
	schemas  *schemaCache

	global    chan struct{}
	wg        sync.WaitGroup
	ccs       []jetstream.ConsumeContext
	cancelSub *nats.Subscription
	runCtx    context.Context
	stopRun   context.CancelCauseFunc
}

type impl struct {
	name    string
	tool    Tool
	builtin *protocol.ToolDefinition
}

var (
	errShutdown       = errors.New("executor shutting down")
	errWorkerCanceled = errors.New("call canceled by its worker")
	implNameRE        = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// New returns an executor; register tools, then Start it.
func New(l Ledger, nc *nats.Conn, cfg Config) (*Executor, error) {
	if cfg.SourceID == "" {
		cfg.SourceID = "cgledger.executor"
	}
	if cfg.Stream == "" {
		cfg.Stream = ledger.DefaultStream
	}
	if cfg.DurablePrefix == "" {
		cfg.DurablePrefix = "cgledger-tool-"
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 5 * time.Second
	}
	if cfg.MaxDeliver == 0 {
		cfg.MaxDeliver = 5
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.LookupEnv == nil {
		cfg.LookupEnv = os.LookupEnv
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("executor: register metrics: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("executor: jetstream: %w", err)
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Executor{l: l, js: js, nc: nc, cfg: cfg, m: m, log: log, tp: tp, impls: map[string]*impl{},
		inflight: map[string]context.CancelCauseFunc{}, sems: map[string]toolSem{}, schemas: newSchemaCache(maxCachedSchemas),
		global: make(chan struct{}, cfg.MaxInFlight)}, nil
}

// Register adds an implementation. Commands on
// cg.<ver>.<project>.<channel>.cmd.tool.<name>[.<more>...] are its: the
// command's tool_name picks the registered definition in the project.
// builtin, when not nil, is the definition used for tool_name == name in
// projects that registered none (its project_id is filled per call).
func (e *Executor) Register(name string, tool Tool, builtin *protocol.ToolDefinition) error {
	if !implNameRE.MatchString(name) {
		return fmt.Errorf("executor: implementation name %q must match %s", name, implNameRE)
	}
	if e.runCtx != nil {
		return errors.New("executor: Register after Start")
	}
	e.impls[name] = &impl{name: name, tool: tool, builtin: builtin}
	return nil
}

// Start creates (or binds) the durable consumers and starts running calls.
func (e *Executor) Start(ctx context.Context) error {
	e.runCtx, e.stopRun = context.WithCancelCause(context.Background())
	sub, err := e.nc.Subscribe(protocol.Root+".*.*.*.ledger.cancel.>", e.onCancel)
	if err != nil {
		return fmt.Errorf("executor: subscribe to cancellations: %w", err)
	}
	e.cancelSub = sub
	for _, im := range e.impls {
		cons, err := e.js.CreateOrUpdateConsumer(ctx, e.cfg.Stream, jetstream.ConsumerConfig{
			Durable:        e.cfg.DurablePrefix + im.name,
			Description:    "cgledger executor: commands for implementation " + im.name,
			FilterSubjects: []string{protocol.Root + ".*.*.*.cmd.tool." + im.name, protocol.Root + ".*.*.*.cmd.tool." + im.name + ".>"},
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        e.cfg.AckWait,
			// Unlimited: a command whose outcome cannot be written yet
			// must come back, never be dropped in silence.
			MaxDeliver:    -1,
			MaxAckPending: 2 * e.cfg.MaxInFlight,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			e.Stop(ctx)
			return fmt.Errorf("executor: consumer for %s: %w", im.name, err)
		}
		cc, err := cons.Consume(e.onMsg(im), jetstream.PullMaxMessages(e.cfg.MaxInFlight))
		if err != nil {
			e.Stop(ctx)
			return fmt.Errorf("executor: consume %s: %w", im.name, err)
		}
		e.ccs = append(e.ccs, cc)
	}
	return e.nc.Flush()
}

// Stop drains: it stops pulling (commands already buffered are nak'ed so
// another executor gets them at once), waits (up to DrainTimeout or ctx, in
// all) for calls in flight, then cancels the rest, which are nak'ed for
// redelivery.
// It is safe to call more than once.
func (e *Executor) Stop(ctx context.Context) {
	e.mu.Lock()
	e.stopping = true
	e.mu.Unlock()
	for _, cc := range e.ccs {
		cc.Drain()
	}
	// One bound for the whole drain, however many consumers there are.
	drain, cancel := context.WithTimeout(ctx, e.cfg.DrainTimeout)
	defer cancel()
	for _, cc := range e.ccs {
		select {
		case <-cc.Closed():
		case <-drain.Done():
		}
	}
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-drain.Done():
	}
	if e.stopRun != nil {
		e.stopRun(errShutdown)
	}
	<-done
	if e.cancelSub != nil {
		_ = e.cancelSub.Unsubscribe()
	}
}

func callKey(project, turn, call string) string { return project + "\x00" + turn + "\x00" + call }

func (e *Executor) onCancel(m *nats.Msg) {
	sub, err := protocol.ParseSubject(m.Subject)
	if err != nil || sub.Kind != protocol.SubjectCancel {
		return
	}
	e.mu.Lock()
	cancel := e.inflight[callKey(sub.Project, sub.AgentTurnID, sub.ToolCallID)]
	e.mu.Unlock()
	if cancel != nil {
		cancel(errWorkerCanceled)
	}
}

func (e *Executor) onMsg(im *impl) jetstream.MessageHandler {
	return func(msg jetstream.Msg) {
		e.mu.Lock()
		if e.stopping {
			e.mu.Unlock()
			_ = msg.Nak()
			return
		}
		e.wg.Add(1)
		e.mu.Unlock()
		select {
		case e.global <- struct{}{}:
		case <-e.runCtx.Done():
			e.wg.Done()
			_ = msg.Nak()
			return
		}
		go func() {
			defer func() { <-e.global; e.wg.Done() }()
			e.process(im, msg)
		}()
	}
}

// opCtx bounds one ledger operation.
func (e *Executor) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(e.runCtx), 15*time.Second)
}

// answer is everything needed to write a call's result card and report.
type answer struct {
	rec      *protocol.CallRecord
	toolName string
	delivery uint64
	trace    context.Context
}

func (e *Executor) process(im *impl, msg jetstream.Msg) {
	start := time.Now()
	meta, err := msg.Metadata()
	if err != nil {
		e.log.Error("command without metadata", "err", err)
		_ = msg.Term()
		return
	}
	if meta.NumDelivered > 1 {
		e.m.redelivered.WithLabelValues(im.name).Inc()
	}
	h := msg.Headers()
	cmd, perr := protocol.ParseToolCommand(msg.Subject(), h, msg.Data())
	if perr != nil {
		e.badCommand(msg, perr)
		return
	}
	sub, id := cmd.Subject, cmd.Identity
	pre := e.prefetch(cmd, meta.NumDelivered > 1)
	rec, err := pre.rec, pre.recErr
	switch {
	case errors.Is(err, protocol.ErrUnknownCall):
		var vs protocol.Violations
		vs.Add("header."+protocol.HeaderToolCallID, protocol.VNotFound, "call %s of turn %s was not dispatched through the ledger", id.ToolCallID, id.AgentTurnID)
		e.reject(msg, &protocol.Error{Code: protocol.CodeUnknownCall, Message: "command for a call the ledger never dispatched", Violations: vs})
		return
	case err != nil:
		e.retryLater(msg, "read call record", err)
		return
	case rec.State == protocol.StateClaimed || (rec.State == protocol.StateDispatched && meta.NumDelivered > 1):
		// A redelivery: a report may be stored whose reporter died before
		// waking the agent. Finish it (idempotent) rather than run the tool
		// again; only a call with no stored report runs.
		ctx, cancel := e.opCtx()
		_, err := e.l.Resume(ctx, sub.Project, id.AgentTurnID, id.ToolCallID)
		cancel()
		if errors.Is(err, protocol.ErrNotReported) && rec.State == protocol.StateDispatched {
			break
		}
		if _, refused := protocol.AsError(err); err != nil && !refused {
			e.retryLater(msg, "resume stored report", err)
			return
		}
		e.ack(msg, "resumed")
		return
	case rec.State != protocol.StateDispatched:
		// Already answered (a redelivery after the report, or a repeated
		// command): nothing to run.
		e.ack(msg, "already answered")
		return
	}

	key := callKey(rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)
	runCtx, stop := context.WithCancelCause(e.runCtx)
	defer stop(nil)
	e.mu.Lock()
	e.inflight[key] = stop
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.inflight, key)
		e.mu.Unlock()
	}()

	spanCtx, span := startSpan(runCtx, e.tp, h, "cgledger.tool "+rec.ToolName)
	defer span.End()
	ans := &answer{rec: rec, toolName: rec.ToolName, delivery: meta.NumDelivered, trace: spanCtx}
	if ans.toolName == "" {
		ans.toolName = im.name
	}

	canceled, err := pre.canceled, pre.cancelErr
	if err != nil {
		e.retryLater(msg, "read cancellation", err)
		return
	}
	if canceled {
		e.finish(msg, ans, canceledOutcome(), 0, nil, start)
		return
	}
	if int(meta.NumDelivered) >= e.cfg.MaxDeliver {
		o := Terminal(CodeRedelivered, fmt.Sprintf("the command was delivered %d times without an outcome (executor crashes or timeouts)", meta.NumDelivered), "look for executor crashes while running this tool")
		e.finish(msg, ans, o, 0, nil, start)
		return
	}
	call, schema, secrets, bad, err := e.prepare(im, cmd, pre)
	if err != nil {
		e.retryLater(msg, "prepare call", err)
		return
	}
	if call != nil {
		ans.toolName = call.ToolName
	}
	if bad != nil {
		e.finish(msg, ans, *bad, 0, secrets, start)
		return
	}
	if vs := validateArgs(schema, call.Arguments); len(vs) > 0 {
		e.finish(msg, ans, Invalid("arguments do not match the tool's parameters schema", vs...), 0, secrets, start)
		return
	}

	call.Timeout = e.timeout(call.Definition, cmd.Payload.TimeoutMS)
	deadline := time.Now().Add(call.Timeout)
	call.Deadline = deadline
	dctx, dcancel := context.WithDeadline(runCtx, deadline)
	defer dcancel()
	hbDone := make(chan struct{})
	go e.heartbeat(msg, hbDone)
	defer close(hbDone)

	o, attempts := e.run(dctx, im, call)
	if errors.Is(context.Cause(runCtx), errShutdown) {
		// Shutting down is not an outcome: let another executor run it.
		_ = msg.Nak()
		return
	}
	e.finish(msg, ans, o, attempts, secrets, start)
}

// prefetched holds what running a command needs to read from the ledger,
// read concurrently: one round trip instead of four.
type prefetched struct {
	rec       *protocol.CallRecord
	recErr    error
	canceled  bool
	cancelErr error
	card      *protocol.StoredCard
	cardErr   error
	toolName  string // the tool read ahead (the payload's); "" when none
	tool      *protocol.StoredTool
	toolErr   error
}

// prefetch reads the call record, the cancellation, the tool.call card and
// the tool definition named by the payload at once. Reads a command turns
// out not to need (an unknown or finished call) cost nothing but the wait.
func (e *Executor) prefetch(cmd *protocol.ToolCommand, redelivered bool) *prefetched {
	ctx, cancel := e.opCtx()
	defer cancel()
	sub, id := cmd.Subject, cmd.Identity
	in := e.l.ReadExecutionInputs(ctx, protocol.ExecutionQuery{
		Project: sub.Project, Channel: sub.Channel, AgentTurnID: id.AgentTurnID, ToolCallID: id.ToolCallID,
		ToolCallCardID: cmd.Payload.ToolCallCardID, ToolName: cmd.Payload.ToolName, Fresh: redelivered,
	})
	p := &prefetched{rec: in.Record, recErr: in.RecordErr, canceled: in.Canceled, cancelErr: in.CancelErr,
		card: in.Card, cardErr: in.CardErr, tool: in.Tool, toolErr: in.ToolErr}
	if protocol.ValidIdentifier(cmd.Payload.ToolName) {
		p.toolName = cmd.Payload.ToolName
	}
	return p
}

func canceledOutcome() Outcome {
	return Outcome{Kind: KindTerminal, Code: CodeCanceled, Message: "the call was canceled by its worker"}
}

// prepare resolves the tool definition and final arguments. A non-nil
// *Outcome is the call's answer (it cannot run); an error is transient.
func (e *Executor) prepare(im *impl, cmd *protocol.ToolCommand, pre *prefetched) (*Call, *jsonschema.Schema, []string, *Outcome, error) {
	ctx, cancel := e.opCtx()
	defer cancel()
	sub, id := cmd.Subject, cmd.Identity
	card, err := pre.card, pre.cardErr
	if errors.Is(err, protocol.ErrUnknownCard) {
		o := Invalid("the tool.call card does not exist", protocol.Violation{Field: "payload.tool_call_card_id", Code: protocol.VNotFound, Message: "card " + cmd.Payload.ToolCallCardID + " not found"})
		return nil, nil, nil, &o, nil
	}
	if err != nil {
		return nil, nil, nil, nil, err
	}
	tc, err := card.Card.ToolCall()
	if err != nil || card.Card.AgentTurnID != id.AgentTurnID || card.Card.ToolCallID != id.ToolCallID {
		o := Invalid("tool_call_card_id does not name this call's tool.call card", protocol.Violation{Field: "payload.tool_call_card_id", Code: protocol.VMismatch, Message: fmt.Sprintf("card %s is not the tool.call card of %s/%s", card.Card.CardID, id.AgentTurnID, id.ToolCallID)})
		return nil, nil, nil, &o, nil
	}
	toolName := cmd.Payload.ToolName
	if toolName == "" {
		toolName = tc.ToolName
	}
	def, seq, err := e.definition(ctx, im, sub.Project, toolName, pre)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	call := &Call{ProjectID: sub.Project, ChannelID: sub.Channel, AgentID: id.AgentID, AgentTurnID: id.AgentTurnID, TurnEpoch: id.TurnEpoch,
		ToolCallID: id.ToolCallID, StepID: id.StepID, ContextBoxID: id.ContextBoxID, ToolName: toolName}
	if def == nil {
		o := Terminal(CodeUnknownTool, fmt.Sprintf("tool %s is not registered in project %s", toolName, sub.Project), "register the tool (POST /projects/"+sub.Project+"/tools)")
		return call, nil, nil, &o, nil
	}
	call.Definition = def
	if target := def.TargetFor(sub.Project, sub.Channel); target != sub.String() {
		o := Terminal("C-CONTRACT-002", fmt.Sprintf("command subject %s is not tool %s's target %s", sub.String(), toolName, target), "publish the command on the tool's target_subject")
		return call, nil, nil, &o, nil
	}
	opts, err := def.ParsedOptions()
	if err != nil {
		o := Terminal(CodeToolConfig, err.Error(), "fix the tool registration")
		return call, nil, nil, &o, nil
	}
	call.Options = opts
	args, secrets, bad := resolveArgs(call, tc.Arguments, opts, card.Card.Metadata, e.lookupEnv)
	if bad != nil {
		return call, nil, secrets, bad, nil
	}
	call.Arguments = args
	schema, err := e.schema(sub.Project, def, seq)
	if err != nil {
		o := Terminal(CodeToolConfig, "the tool's parameters schema does not compile: "+err.Error(), "fix the tool registration")
		return call, nil, secrets, &o, nil
	}
	return call, schema, secrets, nil, nil
}

// definition reads the tool's registered definition (read-your-writes from
// the ledger), falling back to the implementation's built-in one.
func (e *Executor) definition(ctx context.Context, im *impl, project, toolName string, pre *prefetched) (*protocol.ToolDefinition, uint64, error) {
	if protocol.ValidIdentifier(toolName) {
		st, err := pre.tool, pre.toolErr
		if toolName != pre.toolName {
			st, err = e.l.GetTool(ctx, project, toolName)
		}
		if err == nil {
			return &st.Definition, st.Seq, nil
		}
		if !errors.Is(err, protocol.ErrNotFound) {
			return nil, 0, err
		}
	}
	if im.builtin != nil && toolName == im.builtin.ToolName {
		d := *im.builtin
		d.ProjectID = project
		return &d, 0, nil
	}
	return nil, 0, nil
}

func (e *Executor) schema(project string, def *protocol.ToolDefinition, seq uint64) (*jsonschema.Schema, error) {
	key := project + "\x00" + def.ToolName
	if s, ok := e.schemas.get(key, seq); ok {
		return s, nil
	}
	s, err := def.CompileSchema()
	if err != nil {
		return nil, err
	}
	e.schemas.put(key, seq, s)
	return s, nil
}

func (e *Executor) lookupEnv(name string) (string, bool) {
	if v, ok := e.cfg.EnvOverrides[name]; ok {
		return v, true
	}
	return e.cfg.LookupEnv(name)
}

// timeout is the call's deadline: the requested timeout_ms or the tool's
// default, capped at the tool's maximum.
func (e *Executor) timeout(def *protocol.ToolDefinition, requestedMS int64) time.Duration {
	ms := def.Limits.TimeoutMSDefault
	if requestedMS > 0 {
		ms = requestedMS
	}
	if def.Limits.TimeoutMSMax > 0 && ms > def.Limits.TimeoutMSMax {
		ms = def.Limits.TimeoutMSMax
	}
	return time.Duration(ms) * time.Millisecond
}

// heartbeat tells JetStream the command is still being worked on, so it is
// not redelivered to a second executor while this one is alive.
func (e *Executor) heartbeat(msg jetstream.Msg, done <-chan struct{}) {
	t := time.NewTicker(e.cfg.AckWait / 3)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			_ = msg.InProgress()
		}
	}
}

// run runs attempts until an outcome is final: retries only retryable
// classes, with exponential backoff and full jitter (at least retry_after),
// never past the deadline.
func (e *Executor) run(ctx context.Context, im *impl, call *Call) (Outcome, int) {
	def := call.Definition
	sem := e.sem(call.ProjectID, def)
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return e.interrupted(ctx, call), 0
	}
	e.m.inFlight.WithLabelValues(call.ToolName).Inc()
	defer e.m.inFlight.WithLabelValues(call.ToolName).Dec()
	for attempt := 1; ; attempt++ {
		call.Attempt = attempt
		e.m.attempts.WithLabelValues(call.ToolName).Inc()
		o := e.attempt(ctx, im, call)
		if ctx.Err() != nil {
			return e.interrupted(ctx, call), attempt
		}
		if !retryable(o, def.Determinism, attempt) || attempt >= def.Retry.MaxAttempts {
			return o, attempt
		}
		wait := backoff(def.Retry, attempt)
		if o.RetryAfter > wait {
			wait = o.RetryAfter
		}
		if time.Now().Add(wait).After(call.Deadline) {
			return o, attempt
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return e.interrupted(ctx, call), attempt
		}
	}
}

// attempt runs the tool once, recovering panics, and stops waiting at the
// deadline even if the tool ignores its context.
func (e *Executor) attempt(ctx context.Context, im *impl, call *Call) Outcome {
	res := make(chan Outcome, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				e.log.Error("tool panicked", "tool", call.ToolName, "panic", fmt.Sprint(r))
				res <- Retryable(CodeToolPanic, fmt.Sprintf("tool panicked: %v", r), 0)
			}
		}()
		res <- im.tool.Run(ctx, call)
	}()
	select {
	case o := <-res:
		return o
	case <-ctx.Done():
		return Outcome{}
	}
}

// interrupted turns a done context into the call's outcome.
func (e *Executor) interrupted(ctx context.Context, call *Call) Outcome {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errWorkerCanceled):
		return canceledOutcome()
	case errors.Is(cause, errShutdown):
		return Outcome{Kind: KindTerminal, Code: "S-TOOL-SHUTDOWN", Message: "executor shutting down"}
	default:
		e.m.deadlines.WithLabelValues(call.ToolName).Inc()
		return Retryable(CodeTimeout, fmt.Sprintf("the call did not finish within its deadline of %d ms", call.Timeout.Milliseconds()), 0)
	}
}

func backoff(p protocol.RetryPolicy, attempt int) time.Duration {
	capMS := float64(p.CapMS)
	exp := float64(p.BaseMS) * float64(uint64(1)<<min(attempt-1, 30))
	if exp > capMS {
		exp = capMS
	}
	return time.Duration(rand.Float64()*exp) * time.Millisecond
}

func (e *Executor) sem(project string, def *protocol.ToolDefinition) chan struct{} {
	n := def.Limits.ConcurrencyMax
	if n <= 0 {
		n = protocol.DefaultConcurrencyMax
	}
	// One semaphore per tool of a project, replaced when its limit changes
	// (calls holding the old one release into it): re-registrations do not
	// pile up semaphores.
	key := project + "\x00" + def.ToolName
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.sems[key]
	if !ok || s.n != n {
		s = toolSem{n: n, c: make(chan struct{}, n)}
		e.sems[key] = s
	}
	return s.c
}

// toolSem is a tool's concurrency limit and its semaphore.
type toolSem struct {
	n int
	c chan struct{}
}

// resultCardID is deterministic per delivery: a redelivered command writes
// its own card rather than colliding with a card an earlier run may have
// written before crashing.
func resultCardID(key []byte, rec *protocol.CallRecord, delivery uint64) string {
	msg := []byte(rec.ProjectID + "\x00" + rec.AgentTurnID + "\x00" + rec.ToolCallID + "\x00" + strconv.FormatUint(delivery, 10))
	if len(key) == 0 {
		h := sha256.Sum256(msg)
		return "res-" + hex.EncodeToString(h[:16])
	}
	m := hmac.New(sha256.New, key)
	m.Write(msg)
	return "res-" + hex.EncodeToString(m.Sum(nil)[:16])
}

// finish writes the result card and reports it, then acks. A transient
// ledger failure naks for redelivery (the next delivery sees the report if
// it did land and stops there).
func (e *Executor) finish(msg jetstream.Msg, ans *answer, o Outcome, attempts int, secrets []string, start time.Time) {
	rec := ans.rec
	red := redactor(secrets)
	o.Message = red.str(o.Message)
	for i := range o.Violations {
		o.Violations[i].Message = red.str(o.Violations[i].Message)
	}
	content, status, err := resultContent(o, attempts)
	if err != nil {
		o = Terminal(CodeToolPanic, "the tool's output cannot be encoded as JSON: "+err.Error(), "return JSON-encodable output")
		content, status, _ = resultContent(o, attempts)
	}
	if status != protocol.StatusSuccess {
		// The tool's span says how the call ended, as the ledger's spans do.
		span := trace.SpanFromContext(ans.trace)
		span.SetAttributes(attribute.String("cgledger.code", o.Code), attribute.String("cgledger.status", status))
		span.SetStatus(codes.Error, status)
	}
	content = red.bytes(content)
	card := protocol.Card{
		CardID: resultCardID(e.cfg.CardIDKey, rec, ans.delivery), ProjectID: rec.ProjectID, Type: protocol.CardToolResult,
		AuthorID: e.cfg.SourceID, FunctionName: ans.toolName, AgentTurnID: rec.AgentTurnID, ToolCallID: rec.ToolCallID,
		Content: content, Metadata: rec.CardMetadata,
	}
	ctx, cancel := e.opCtx()
	defer cancel()
	if _, err := e.l.PutCard(ctx, card); err != nil {
		if le, refused := protocol.AsError(err); refused && le.Code == protocol.CodeBadRequest {
			// The result itself is unacceptable (too large...): answer with
			// that instead, which always fits.
			o = Terminal("S-TOOL-RESULT", "the tool's result was refused by the ledger: "+le.Message, "return a smaller result")
			content, status, _ = resultContent(o, attempts)
			card.Content = content
			card.CardID += "-r"
			_, err = e.l.PutCard(ctx, card)
		}
		if err != nil {
			e.retryLater(msg, "put result card", err)
			return
		}
	}
	traceparent, tracestate := injectTrace(ans.trace)
	id := protocol.Identity{AgentID: rec.AgentID, AgentTurnID: rec.AgentTurnID, TurnEpoch: rec.TurnEpoch, ToolCallID: rec.ToolCallID,
		StepID: rec.StepID, Traceparent: traceparent, Tracestate: tracestate}
	_, err = e.l.Report(ctx, protocol.ReportRequest{
		ProjectID: rec.ProjectID, ChannelID: rec.ChannelID, Identity: id, SourceID: e.cfg.SourceID, SourceFunction: ans.toolName,
		Payload: protocol.ReportPayload{Status: status, AfterExecution: rec.AfterExecution, ToolResultCardID: card.CardID, StepID: rec.StepID},
	})
	if err != nil {
		if _, refused := protocol.AsError(err); !refused {
			e.retryLater(msg, "report", err)
			return
		}
		// Refused (stale epoch, a different result already reported...):
		// the ledger recorded why; this command is answered.
		e.log.Warn("report refused", "tool", ans.toolName, "call", rec.ToolCallID, "err", err)
	}
	e.ack(msg, "reported")
	e.m.calls.WithLabelValues(ans.toolName, status, errorClass(o)).Inc()
	e.m.duration.WithLabelValues(ans.toolName).Observe(time.Since(start).Seconds())
	e.log.Info("call resolved", "tool", ans.toolName, "call", rec.ToolCallID, "status", status, "code", o.Code, "attempts", attempts, "duration_ms", time.Since(start).Milliseconds())
}

func errorClass(o Outcome) string {
	if o.Kind == KindSuccess {
		return ""
	}
	return class(o.Code)
}

// retryLater naks with a delay so JetStream redelivers the command.
func (e *Executor) retryLater(msg jetstream.Msg, what string, err error) {
	delay := time.Second
	if meta, merr := msg.Metadata(); merr == nil {
		// Back off while the failure lasts (a full disk can last a while).
		delay = min(time.Duration(meta.NumDelivered)*time.Second, 30*time.Second)
	}
	e.log.Warn("transient failure; command will be redelivered", "step", what, "err", err, "retry_in", delay)
	e.m.retries.Inc()
	if e.runCtx.Err() != nil {
		_ = msg.Nak()
		return
	}
	_ = msg.NakWithDelay(delay)
}

// badCommand answers a command that does not validate: with a failed
// result through the report path when its identity routes to a dispatched
// call, else with a rejection entry. Either way it is acked.
func (e *Executor) badCommand(msg jetstream.Msg, perr error) {
	le, _ := protocol.AsError(perr)
	if le == nil {
		le = &protocol.Error{Code: protocol.CodeBadRequest, Message: perr.Error()}
	}
	sub, serr := protocol.ParseSubject(msg.Subject())
	id, idViolations := protocol.ParseIdentity(msg.Headers(), protocol.IdentityRules{RequireToolCallID: true})
	if serr == nil && sub.IsCommand() && len(idViolations) == 0 {
		ctx, cancel := e.opCtx()
		rec, err := e.l.GetCall(ctx, sub.Project, id.AgentTurnID, id.ToolCallID)
		cancel()
		if err == nil && rec.State == protocol.StateDispatched && rec.ChannelID == sub.Channel {
			meta, _ := msg.Metadata()
			ans := &answer{rec: rec, toolName: rec.ToolName, delivery: meta.NumDelivered, trace: e.runCtx}
			if ans.toolName == "" {
				ans.toolName = "unknown"
			}
			o := Outcome{Kind: KindInvalid, Code: CodeBadCommand, Message: "the tool command does not follow the protocol", Violations: le.Violations}
			e.finish(msg, ans, o, 0, nil, time.Now())
			return
		}
	}
	e.reject(msg, le)
}

func (e *Executor) reject(msg jetstream.Msg, le *protocol.Error) {
	ctx, cancel := e.opCtx()
	defer cancel()
	if err := e.l.RejectCommand(ctx, msg.Subject(), msg.Headers(), msg.Data(), le); err != nil {
		e.retryLater(msg, "record command rejection", err)
		return
	}
	e.m.rejected.WithLabelValues(string(le.Code)).Inc()
	e.ack(msg, "rejected")
}

// ack acknowledges a command whose answer is in the ledger. A failed ack
// only means a redelivery, which finds the call answered and acks again;
// it is logged so that a run of them (a lost connection) is seen.
func (e *Executor) ack(msg jetstream.Msg, why string) {
	if err := msg.Ack(); err != nil {
		e.log.Warn("ack command", "subject", msg.Subject(), "after", why, "err", err)
	}
}
