// Package ledger is the write side of cgledger: provisioning of the ledger
// stream and the call-record KV bucket; the operations that append to the
// ledger (put card, dispatch, report, roster, consume, cancel, skip); export
// and import; and the request/reply API server that answers clients for
// them. Only this package writes ledger entries. The wire contract it
// enforces is package protocol.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cgledger/cgledger/internal/backoff"
	"github.com/cgledger/cgledger/internal/schemacache"
	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/stream"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Ledger. The zero value works against a single embedded
// server: protocol version v1, default stream and bucket, no metrics
// registration, logs discarded.
type Config struct {
	// Version is the protocol version token written in subjects. Empty means v1.
	Version string
	// Streams describes the JetStream resources; see stream.Config.
	Streams stream.Config
	// Registerer receives the ledger's metrics. Nil means they are kept but
	// not registered anywhere.
	Registerer prometheus.Registerer
	// Logger receives operational logs. Nil discards them.
	Logger *slog.Logger
	// WriteGuard, when set, is asked before every write; an error refuses
	// the write (wrapped) before it reaches the server. serve sets it to
	// the data directory's free-space check on the embedded server, so
	// writes stop before the disk is full. Nil means no check.
	WriteGuard func() error
	// ReportLease is how long, from a report entry's time, its writer alone
	// finishes it (wakeup, mark woken) before a concurrent or retried
	// identical report takes over. Zero means 5s.
	ReportLease time.Duration
	// DeadlineGrace is how long after a call's deadline the ledger waits
	// before it records the timeout itself, so that an executor that
	// stopped the tool at the deadline reports its own timeout (with its
	// attempts). A report later than deadline + grace is late. Zero means
	// 5s; negative means none.
	DeadlineGrace time.Duration
	// ApprovalLease is how long after an approval's decision its decider
	// alone publishes the follow-up (the command and the approved wakeup):
	// a refused decision, a cancel or a read within it sees the call as
	// approved without publishing again, so core NATS subscribers of the
	// tool's subject get one command; after it, whoever finds the
	// follow-up unfinished (the decider crashed) finishes it. Zero means
	// DefaultApprovalFinishAfter; negative means none (tests).
	ApprovalLease time.Duration
	// BuiltinTools are the definitions of tools an executor serves
	// without a registration (serve's echo and sleep): a call to one in a
	// project that registered none gets its deadline from them. They are
	// served in every project, whichever process runs the executor, so
	// their names are tool labels of their own (ToolLabels) and their
	// timeouts are exported (ToolCollector).
	BuiltinTools []protocol.ToolDefinition
	// Retention, when positive, is how long entries stay in the stream: each
	// is written with it as its JetStream TTL, except tool definitions,
	// roster entries and skip entries, which never expire
	// (stream.KeptForever). An archive must copy the entries before they go
	// (package archive; serve's retention setting). Zero keeps every entry.
	Retention time.Duration
	// ToolAckWait is the ack wait of the tool consumers made for
	// tool.consumer (ack_wait_ms in its answer): how long a command held by
	// a tool service that stopped waits before it is delivered again.
	// Zero means 30s.
	ToolAckWait time.Duration
	// ResultWrites says how report.result stores its card and report
	// entry. The zero value (ResultWritesAuto) is one atomic batch of both
	// on a replicated stream (Streams.Replicas above 1: one proposal for
	// both) and two appends, the card's then the report's, on a single
	// replica: nats-server syncs an R1 file-stored batch to disk before
	// committing it, which costs far more than the second append
	// (docs/performance.md, "One request for a result"). Safe either way:
	// every check is made before the card is stored, and a card left
	// without its report is found, identical, by the retry.
	ResultWrites ResultWrites
}

// ResultWrites is how report.result stores a result card and its report
// entry (Config.ResultWrites).
type ResultWrites string

// The ways report.result may store its two entries.
const (
	// ResultWritesAuto batches on a replicated stream, appends one after
	// the other on a single replica.
	ResultWritesAuto ResultWrites = ""
	// ResultWritesBatch always stores both as one atomic batch.
	ResultWritesBatch ResultWrites = "batch"
	// ResultWritesSequential always appends the card, then the report.
	ResultWritesSequential ResultWrites = "sequential"
)

// sequential resolves w for a stream of the given replica count.
func (w ResultWrites) sequential(replicas int) bool {
	switch w {
	case ResultWritesBatch:
		return false
	case ResultWritesSequential:
		return true
	default:
		return replicas <= 1
	}
}

// step names a point in the report path, for fault-injection tests
// (export_test.go gives the tests these names).
type step string

// Report-path steps, in order (docs/report-path.md).
const (
	stepAppended    step = "appended"     // report entry acknowledged by the stream (the claim)
	stepWoken       step = "woken"        // wakeup (or wakeup_skipped) acknowledged
	stepMarkedWoken step = "marked_woken" // a takeover's lock written on the call record (woken.go; the writer's path writes none)
	// stepResultChecked: a report.result checked, before its atomic batch
	// (card and report) is published.
	stepResultChecked step = "result_checked"

	stepDispatchCard   step = "dispatch_card"   // tool.call card acknowledged
	stepDispatchRecord step = "dispatch_record" // call record created in KV
	// stepDispatchRecordExists: the call record's create failed because a
	// record exists (another dispatch of the call, maybe one being refused).
	stepDispatchRecordExists step = "dispatch_record_exists"
	stepDispatchCommand      step = "dispatch_command" // command acknowledged

	// Approval steps (approval.go).
	stepHeld            step = "held"             // held entry acknowledged (a held call's dispatch)
	stepApprovalDecided step = "approval_decided" // approval entry acknowledged (the decision)
	stepApprovalCommand step = "approval_command" // an approved call's command acknowledged
	stepApprovalWoken   step = "approval_woken"   // its approved wakeup acknowledged

	// Redrive steps (redrive.go).
	stepRedriveEntry step = "redrive_entry" // redrive entry acknowledged, before the derived call's dispatch

	// Pause steps (pause.go).
	stepPauseHeld      step = "pause_held"      // held entry of a paused tool's call acknowledged
	stepResumed        step = "resumed"         // resume entry acknowledged
	stepResumeMarked   step = "resume_marked"   // a held call's record marked released, before its command
	stepResumeReleased step = "resume_released" // one paused call's command acknowledged by a resume
)

// Ledger appends to and reads from the ledger stream. It is safe for
// concurrent use.
type Ledger struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream
	kv      jetstream.KeyValue
	version string
	streams stream.Config
	m       *metrics
	log     *slog.Logger
	lease   time.Duration
	grace   time.Duration
	// approvalLease is Config.ApprovalLease with its default.
	approvalLease time.Duration
	builtin       map[string]*protocol.ToolDefinition
	// schemas are the compiled parameters schemas of dispatches'
	// checks.arguments.
	schemas *schemacache.Cache
	cache   *caches
	// keeperAcks are the commands the deadline keeper acknowledges once
	// this process has reported their calls (keeperacks.go).
	keeperAcks *keeperAcks
	// results groups concurrent report.result batches (result.go).
	results resultBatcher
	// sequentialResults: report.result appends the card, then the report
	// (Config.ResultWrites resolved).
	sequentialResults bool
	labels            *toollabels.Labels
	guard             func() error
	fault             storageFault
	bg                background
	// ttl is the Nats-TTL written on entries that expire, empty for none.
	ttl string
	// health is who pulls tool commands, for health.fail_fast_after_ms.
	health toolHealth
	// toolAckWait is the tool consumers' ack wait (Config.ToolAckWait).
	toolAckWait time.Duration
	// pauses holds the pause state of tools as last read (pauseState by
	// pauseKey): a first guess only, every write that depends on it
	// carries the expectation that checks it.
	pauses sync.Map
	// resumesDone holds, per tool (pauseKey), the sequence of the last
	// resume whose release this process finished or found finished: a
	// dispatch finishes a resume cut short (its process died) before its
	// own command, once per resume.
	resumesDone sync.Map

	// afterStep, when set (tests only), runs after each report-path step; a
	// non-nil error aborts the report there, as a crash would.
	afterStep atomic.Pointer[func(step) error]
}

// Open provisions (idempotently) the ledger stream and bucket and returns a
// Ledger bound to them. A configuration Validate refuses is refused, with
// its every problem, before anything is provisioned.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Ledger, error) {
	if nc == nil {
		return nil, errors.New("ledger: open: nil NATS connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ledger: open: %w", err)
	}
	version := cfg.Version
	if version == "" {
		version = protocol.DefaultVersion
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("ledger: open: jetstream: %w", err)
	}
	streams := cfg.Streams.WithDefaults()
	if err := stream.Provision(ctx, js, streams); err != nil {
		return nil, fmt.Errorf("ledger: open: %w", err)
	}
	st, err := js.Stream(ctx, streams.Stream)
	if err != nil {
		return nil, fmt.Errorf("ledger: open: bind stream %s: %w", streams.Stream, err)
	}
	kv, err := js.KeyValue(ctx, streams.Bucket)
	if err != nil {
		return nil, fmt.Errorf("ledger: open: bind bucket %s: %w", streams.Bucket, err)
	}
	// The last step that talks to JetStream, before anything is registered
	// or started: a caller may open again after an error (serve does while
	// a cluster elects a leader).
	var ttl string
	if cfg.Retention > 0 {
		if err := stream.EnableMsgTTL(ctx, st, js); err != nil {
			return nil, fmt.Errorf("ledger: open: retention needs per-message TTLs (nats-server 2.11 or later): %w", err)
		}
		ttl = stream.TTL(cfg.Retention)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lease := cfg.ReportLease
	if lease <= 0 {
		lease = 5 * time.Second
	}
	grace := cfg.DeadlineGrace
	switch {
	case grace == 0:
		grace = DefaultDeadlineGrace
	case grace < 0:
		grace = 0
	}
	approvalLease := cfg.ApprovalLease
	switch {
	case approvalLease == 0:
		approvalLease = DefaultApprovalFinishAfter
	case approvalLease < 0:
		approvalLease = 0
	}
	toolAckWait := cfg.ToolAckWait
	if toolAckWait <= 0 {
		toolAckWait = 30 * time.Second
	}
	builtin := map[string]*protocol.ToolDefinition{}
	for i := range cfg.BuiltinTools {
		d := cfg.BuiltinTools[i]
		builtin[d.ToolName] = &d
	}
	c := newCaches()
	if err := c.watch(nc, version); err != nil {
		// Without the watch, roster and tool entries are read every time.
		log.Warn("ledger: cannot watch roster and tool changes; their caches stay off", "err", err)
	}
	names, err := registeredToolNames(ctx, st, version)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("ledger: open: %w", err)
	}
	c.labels.Add(names...)
	for name := range builtin {
		c.labels.AddBuiltin(name)
	}
	// Registered last: a caller that opens again after an error above
	// must not find the metrics taken.
	m, err := newMetrics(cfg.Registerer, c.labels)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("ledger: open: register metrics: %w", err)
	}
	return &Ledger{nc: nc, js: js, stream: st, kv: kv, version: version, streams: streams, m: m, log: log, lease: lease, grace: grace, approvalLease: approvalLease, builtin: builtin, schemas: schemacache.New(maxCachedSchemas), cache: c, keeperAcks: newKeeperAcks(nc), labels: c.labels, guard: cfg.WriteGuard, ttl: ttl, toolAckWait: toolAckWait, sequentialResults: cfg.ResultWrites.sequential(streams.Replicas)}, nil
}

// Close stops the cache watch and waits for the reports in flight (a report
// let go between its append and its wakeup is left for a sweep). It does not
// close the NATS connection, which the caller owns.
func (l *Ledger) Close() {
	l.cache.close()
	l.bg.wait()
}

// Version is the protocol version token this ledger writes.
func (l *Ledger) Version() string { return l.version }

// StreamName is the ledger stream's name.
func (l *Ledger) StreamName() string { return l.streams.Stream }

// BucketName is the call-record KV bucket's name.
func (l *Ledger) BucketName() string { return l.streams.Bucket }

// step runs the fault-injection hook.
func (l *Ledger) step(s step) error {
	f := l.afterStep.Load()
	if f == nil || *f == nil {
		return nil
	}
	if err := (*f)(s); err != nil {
		return fmt.Errorf("aborted after step %s: %w", s, err)
	}
	return nil
}

// appendEntry publishes one entry and waits for the stream's
// acknowledgement. by is the caller whose request wrote it, recorded as its
// CG-Actor (a wakeup names none); nil for the ledger's own entries.
func (l *Ledger) appendEntry(ctx context.Context, by *protocol.Caller, kind protocol.EntryKind, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if err := l.writable(); err != nil {
		return nil, err
	}
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	msg.Header.Set(protocol.HeaderEntryKind, string(kind))
	l.expire(kind, msg)
	if by != nil && by.Actor != "" && kind != protocol.KindWakeup {
		msg.Header.Set(protocol.HeaderActor, by.Actor)
	}
	start := time.Now()
	if msg.Header.Get(protocol.HeaderTime) == "" {
		msg.Header.Set(protocol.HeaderTime, protocol.FormatTime(start))
	}
	opts = append(opts, jetstream.WithExpectStream(l.streams.Stream))
	ack, err := untilDecided(ctx, func() (*jetstream.PubAck, error) { return l.js.PublishMsg(ctx, msg, opts...) })
	l.fault.note(err)
	if err != nil {
		return nil, err
	}
	l.m.appendLatency.WithLabelValues(string(kind)).Observe(time.Since(start).Seconds())
	if !ack.Duplicate {
		l.m.appends.WithLabelValues(string(kind)).Inc()
	}
	return ack, nil
}

// writable asks the write guard, if any.
func (l *Ledger) writable() error {
	if l.guard == nil {
		return nil
	}
	if err := l.guard(); err != nil {
		l.m.writesRefused.Inc()
		return fmt.Errorf("write refused: %w", err)
	}
	return nil
}

// lastForSubject reads the newest entry on an exact subject. It returns
// (nil, nil) when there is none.
func (l *Ledger) lastForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	msg, err := l.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", subject, err)
	}
	return msg, nil
}

// isWrongLastSeq reports a failed "expected last sequence" check: the
// subject holds an entry the writer did not expect (JetStream's 10071). The
// entry is applied on the server that checked, so it can be read. Code 10164
// is not this answer but "not decided yet" (isUndecided): writes go through
// untilDecided, which waits it out.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// isUndecided reports a write the server refused only because another write
// it cannot see through yet is in flight: JetStream's 10158 (a message with
// the same Nats-Msg-Id is being stored) or 10164. A replicated stream's
// leader answers 10164 to an "expected last sequence" check on a subject
// that has an append proposed to its Raft group and not yet applied
// (nats-server's expectedPerSubjectInProcess and inflight checks): the entry
// the check is about may or may not be stored in a moment, and nothing
// readable tells which. Asked again once the proposal is applied (or
// dropped), the server gives a definite answer.
func isUndecided(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == 10158 || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// untilDecided runs write, and again after a growing delay for as long as
// the server answers isUndecided, so that its caller sees success or a
// definite refusal. It gives up only when ctx ends, with ctx's error.
func untilDecided[T any](ctx context.Context, write func() (T, error)) (T, error) {
	v, err := write()
	for wait := backoff.New(time.Millisecond, 50*time.Millisecond); err != nil && isUndecided(err); {
		if werr := wait.Wait(ctx); werr != nil {
			var zero T
			return zero, fmt.Errorf("%w (waiting for a write in flight on the same subject: %v)", werr, err)
		}
		v, err = write()
	}
	return v, err
}

// storedEntry reads the entry on subject that an append expecting the
// subject empty was refused for (isWrongLastSeq). The refusal says the entry
// is stored, yet a read can reach a server that has not applied it (a stream
// leader elected in between): it reads again after a growing delay until the
// entry shows or ctx ends. It never returns a nil entry without an error.
func (l *Ledger) storedEntry(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	for wait := backoff.New(time.Millisecond, 50*time.Millisecond); ; {
		m, err := l.lastForSubject(ctx, subject)
		if err == nil && m != nil {
			return m, nil
		}
		if werr := wait.Wait(ctx); werr != nil {
			if err == nil {
				return nil, fmt.Errorf("read %s: the stream refused an append for an entry it holds, which no read found: %w", subject, werr)
			}
			return nil, fmt.Errorf("%w (last read: %w)", werr, err)
		}
	}
}

// isTooLarge reports a message over the stream's size limit.
func isTooLarge(err error) bool {
	return errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) || errors.Is(err, nats.ErrMaxPayload)
}
