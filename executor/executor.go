package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/internal/schemacache"
	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// Ledger is what the executor needs from the ledger. *ledger.Ledger
// provides it; every read is read-your-writes, so the executor never depends
// on a projection.
type Ledger interface {
	ReadExecutionInputs(ctx context.Context, q protocol.ExecutionQuery) protocol.ExecutionInputs
	GetCall(ctx context.Context, project, turnID, callID string) (*protocol.CallRecord, error)
	// Canceled reads whether a call was canceled, always from the server.
	Canceled(ctx context.Context, project, channel, turnID, callID string) (bool, error)
	GetTool(ctx context.Context, project, tool string) (*protocol.StoredTool, error)
	PutCard(ctx context.Context, card protocol.Card) (protocol.PutCardResult, error)
	Report(ctx context.Context, req protocol.ReportRequest) (protocol.ReportOutcome, error)
	// ReportResult stores a result card and its report together (the
	// report.result operation): how the executor answers a call.
	ReportResult(ctx context.Context, card protocol.Card, req protocol.ReportRequest) (protocol.ReportResultOutcome, error)
	Resume(ctx context.Context, project, turnID, callID string) (protocol.ReportOutcome, error)
	RejectCommand(ctx context.Context, subject string, h nats.Header, data []byte, e *protocol.Error) error
	// StartAttempt is only called for side_effectful tools.
	StartAttempt(ctx context.Context, req protocol.AttemptStartRequest) (protocol.AttemptStartResult, error)
	// Prepare and TwoPhase are only called for tools implementing Preparer.
	Prepare(ctx context.Context, req protocol.PrepareRequest) (protocol.PrepareResult, error)
	TwoPhase(ctx context.Context, project, turnID, callID string) (*protocol.TwoPhase, error)
	// EnsureToolConsumer is only called for Config.Bindings.
	EnsureToolConsumer(ctx context.Context, project, tool string) (protocol.ToolConsumer, error)
}

// Config configures an Executor. Zero values mean the documented defaults.
type Config struct {
	// SourceID is the author_id of result cards and the CG-Source-Id of
	// reports. Empty means "cgledger.executor".
	SourceID string
	// Stream is the ledger stream. Empty means stream.DefaultName.
	Stream string
	// DurablePrefix names the durable consumers: prefix + implementation.
	// Empty means "cgledger-tool-". Executors sharing a prefix share the work.
	DurablePrefix string
	// AckWait is how long JetStream waits for an ack before redelivering,
	// and so how soon another executor takes over the calls of one that
	// died. Zero means 5s; running calls heartbeat every AckWait/3, so a
	// long call is never redelivered while its executor lives.
	AckWait time.Duration
	// Retry, when set, is asked about each failed consumer creation in
	// Start (step names the consumer): nil means "try again" (it has waited
	// as long as it wanted), an error ends Start with that error. Nil fails
	// Start at the first error. serve sets it to its start-up policy, to
	// wait out a cluster electing a leader.
	Retry func(ctx context.Context, step string, err error) error
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
	// Bindings, when set, make the executor pull the consumers the ledger
	// keeps for these tools of these projects (protocol.md, tool.consumer)
	// and listen for those projects' cancellations only, rather than make
	// durable consumers of its own over every project: what a tool
	// credential may do, so an executor in another process can run on one.
	// Each binding's Tool must be a registered implementation, and only
	// bound implementations run; Stream and DurablePrefix are then unused.
	// Empty means consumers of its own, which needs the JetStream API of
	// the ledger's account.
	Bindings []Binding
}

// Binding names a tool target of a project whose ledger-kept consumer an
// executor pulls (Config.Bindings).
type Binding struct {
	Project string
	Tool    string
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
	// labels gives every tool label (toollabels.Labels): the ledger's when
	// the executor runs in its process, else its own.
	labels *toollabels.Labels

	mu       sync.Mutex
	stopping bool
	inflight map[string]context.CancelCauseFunc
	// handling maps each call this process is handling a command of to
	// that command's stream sequence, so that a copy of the command (a
	// second message for the call, not a redelivery of the same one) is
	// not run beside it.
	handling map[string]uint64
	sems     map[string]toolSem
	schemas  *schemacache.Cache

	global     chan struct{}
	wg         sync.WaitGroup
	ccs        []jetstream.ConsumeContext
	cancelSubs []*nats.Subscription
	runCtx     context.Context
	stopRun    context.CancelCauseFunc
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

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration (a negative bound), or nil. Zero values are the
// defaults and pass; New calls it. Bindings are checked by Start, against
// the implementations registered by then.
func (c Config) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "AckWait", c.AckWait)
	configcheck.NonNegative(&vs, "MaxDeliver", c.MaxDeliver)
	configcheck.NonNegative(&vs, "MaxInFlight", c.MaxInFlight)
	configcheck.NonNegative(&vs, "DrainTimeout", c.DrainTimeout)
	return protocol.BadRequest("executor config", vs)
}

// New returns an executor; register tools, then Start it. A configuration
// Validate refuses is refused with its every problem.
func New(l Ledger, nc *nats.Conn, cfg Config) (*Executor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	if cfg.SourceID == "" {
		cfg.SourceID = "cgledger.executor"
	}
	if cfg.Stream == "" {
		cfg.Stream = stream.DefaultName
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
	labels := toollabels.New()
	labels.AddBuiltin(protocol.ReservedToolNames...)
	if tl, ok := l.(interface{ ToolLabels() *toollabels.Labels }); ok {
		labels = tl.ToolLabels()
	}
	return &Executor{l: l, js: js, nc: nc, cfg: cfg, m: m, log: log, tp: tp, impls: map[string]*impl{}, labels: labels,
		inflight: map[string]context.CancelCauseFunc{}, handling: map[string]uint64{}, sems: map[string]toolSem{}, schemas: schemacache.New(maxCachedSchemas),
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
	// At 0 from the start, so the first redelivery counts in increase().
	e.m.redelivered.WithLabelValues(name)
	if builtin != nil {
		e.labels.AddBuiltin(builtin.ToolName)
		e.labels.AddVersion(builtin.ToolName, builtin.Version)
		e.m.deadlines.WithLabelValues(e.labels.Label(builtin.ToolName))
	}
	// Likewise the deadline expiries of the implementation's tool (by
	// label: _other for a name registered nowhere yet), so the first
	// timeout counts in increase().
	e.m.deadlines.WithLabelValues(e.labels.Label(name))
	return nil
}

// Start creates (or binds) the durable consumers and starts running calls.
func (e *Executor) Start(ctx context.Context) error {
	e.runCtx, e.stopRun = context.WithCancelCause(context.Background())
	if len(e.cfg.Bindings) > 0 {
		return e.startBound(ctx)
	}
	sub, err := e.nc.Subscribe(protocol.CancelSubjectPattern("*", "*"), e.onCancel)
	if err != nil {
		return fmt.Errorf("executor: subscribe to cancellations: %w", err)
	}
	e.cancelSubs = append(e.cancelSubs, sub)
	for _, im := range e.impls {
		cons, err := e.createConsumer(ctx, im)
		if err != nil {
			e.Stop(ctx)
			return fmt.Errorf("executor: consumer for %s: %w", im.name, err)
		}
		cc, err := cons.Consume(e.onMsg(im, e.cfg.AckWait), jetstream.PullMaxMessages(e.cfg.MaxInFlight))
		if err != nil {
			e.Stop(ctx)
			return fmt.Errorf("executor: consume %s: %w", im.name, err)
		}
		e.ccs = append(e.ccs, cc)
	}
	return e.nc.Flush()
}

// createConsumer creates (or updates) im's durable consumer, asking
// Config.Retry after each failure.
func (e *Executor) createConsumer(ctx context.Context, im *impl) (jetstream.Consumer, error) {
	for {
		cons, err := e.js.CreateOrUpdateConsumer(ctx, e.cfg.Stream, jetstream.ConsumerConfig{
			Durable:        e.cfg.DurablePrefix + im.name,
			Description:    "cgledger executor: commands for implementation " + im.name,
			FilterSubjects: []string{protocol.ToolCommandSubject("*", "*", "*", im.name), protocol.ToolCommandSubject("*", "*", "*", im.name, ">")},
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        e.cfg.AckWait,
			// Unlimited: a command whose outcome cannot be written yet
			// must come back, never be dropped in silence.
			MaxDeliver:    -1,
			MaxAckPending: 2 * e.cfg.MaxInFlight,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err == nil || e.cfg.Retry == nil {
			return cons, err
		}
		if rerr := e.cfg.Retry(ctx, "consumer for "+im.name, err); rerr != nil {
			return nil, rerr
		}
	}
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
	for _, sub := range e.cancelSubs {
		_ = sub.Unsubscribe()
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

func (e *Executor) onMsg(im *impl, ackWait time.Duration) jetstream.MessageHandler {
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
			e.process(im, msg, ackWait)
		}()
	}
}

// opCtx bounds one ledger operation.
func (e *Executor) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(e.runCtx), 15*time.Second)
}
