package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// DeadlineKeeperConfig configures a DeadlineKeeper.
type DeadlineKeeperConfig struct {
	// Durable is the consumer's name; every serve process of a ledger
	// shares it, so the deadlines of a process that died are kept by the
	// others. Empty means DefaultDeadlineDurable plus the protocol version.
	Durable string
	// AckWait is how long a command taken by a process that then stops
	// (or crashes) waits before another process gets it. Zero means 30s.
	AckWait time.Duration
	// Workers bounds the commands handled at once. Zero means 16.
	Workers int
	// Retry, when set, is asked after the consumer cannot be created (a
	// cluster still electing its leaders): nil to try again, an error to
	// give up with it. Nil gives up at once.
	Retry func(ctx context.Context, step string, err error) error
}

// DefaultDeadlineDurable prefixes the deadline keeper's consumer name.
const DefaultDeadlineDurable = "cgledger-deadlines-"

// DeadlineKeeper keeps every call's deadline: a durable pull consumer of
// the commands already stored in the ledger stream, so it adds no write to
// dispatch. A command whose call is reported is acked; one whose deadline
// (plus the grace) has not come yet is handed back to the server to be
// delivered again then (NakWithDelay); one past it gets the ledger's
// timeout (recordTimeout) and is acked.
type DeadlineKeeper struct {
	l   *Ledger
	run keeper
}

// StartDeadlineKeeper creates (or binds) the keeper's consumer and starts
// consuming. Stop it with Stop.
func (l *Ledger) StartDeadlineKeeper(ctx context.Context, cfg DeadlineKeeperConfig) (*DeadlineKeeper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("deadline keeper: %w", err)
	}
	if cfg.Durable == "" {
		cfg.Durable = DefaultDeadlineDurable + l.version
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 16
	}
	k := &DeadlineKeeper{l: l}
	err := k.run.start(ctx, keeperSpec{
		name:    "deadline keeper",
		log:     l.log,
		workers: cfg.Workers,
		create: l.keeperConsumer("deadline keeper", jetstream.ConsumerConfig{
			Durable:     cfg.Durable,
			Description: "cgledger: the deadline of every call (serve's deadline keeper)",
			// Tool and PMO commands; not the wakeups under cmd.agent. And
			// the prepares, whose commit deadlines it keeps the same way.
			// And the held entries, whose paused calls have deadlines and
			// no command yet; and the pause subjects, whose resumes it
			// finishes. Every call not yet reported stays pending until
			// its deadline.
			FilterSubjects: []string{protocol.ToolCommandsFilter(l.version), protocol.PMOCommandsFilter(l.version, "*", "*"),
				protocol.CallEntriesFilter(l.version, "*", protocol.SubjectPrepared), protocol.CallEntriesFilter(l.version, "*", protocol.SubjectHeld),
				protocol.PauseEntriesFilter(l.version)},
			AckWait: cfg.AckWait,
		}),
		retry:   cfg.Retry,
		process: k.process,
	})
	if err != nil {
		return nil, err
	}
	// A resume cut short by a crash is finished at once, not when its
	// entry comes back to a keeper after AckWait: its held calls may have
	// deadlines shorter than that.
	l.bg.start()
	go func() {
		defer l.bg.done()
		l.finishResumes(k.run.ctx)
	}()
	return k, nil
}

// Stop stops taking commands and waits (up to ctx) for those being
// handled. Commands taken and not handled come back to another process (or
// this one, started again) after AckWait.
func (k *DeadlineKeeper) Stop(ctx context.Context) error {
	return k.run.stop(ctx)
}

// process decides one delivery of a command.
func (k *DeadlineKeeper) process(msg jetstream.Msg) {
	l := k.l
	switch protocol.HeaderGet(msg.Headers(), protocol.HeaderEntryKind) {
	case string(protocol.KindPrepared):
		k.processPrepared(msg)
		return
	case string(protocol.KindDecision):
		// Routed to the tool; the call's deadline is its command's.
		_ = msg.Ack()
		return
	case string(protocol.KindHeld):
		k.processHeld(msg)
		return
	case string(protocol.KindToolPause):
		k.processPause(msg)
		return
	}
	now := time.Now()
	if d := commandDeadline(msg.Data()); d > 0 {
		// The command carries the deadline: no read, and no validation,
		// until it is due. Every command is delivered here once at
		// dispatch, long before its deadline, so this is the common case.
		if due := time.UnixMilli(d).Add(l.grace); now.Before(due) {
			_ = msg.NakWithDelay(due.Sub(now))
			k.ackWhenReported(msg, due)
			return
		}
	}
	cmd, err := protocol.ParseToolCommand(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		// Not a command the ledger dispatched (dispatch validates its
		// own); the tool's service answers it.
		_ = msg.Ack()
		return
	}
	ctx, cancel := context.WithTimeout(k.run.ctx, 30*time.Second)
	defer cancel()
	id := cmd.Identity
	key := callKey(cmd.Subject.Project, id.AgentTurnID, id.ToolCallID)
	l.keeperAcks.forget(key)
	if l.reportedHere(key) {
		// This process stored the call's report and its wakeup (its memory
		// says so only then, and a report is never taken back): nothing to
		// keep, and no read. The usual case with one serve process.
		_ = msg.Ack()
		return
	}
	rec, _, err := l.getRecord(ctx, key)
	if err != nil {
		k.run.later(msg, "read call record", err)
		return
	}
	if rec == nil {
		// Expired with the retention, or a dispatch refused before its
		// command: nothing waits for it.
		_ = msg.Ack()
		return
	}
	if rec, err = l.settleHeld(ctx, rec); err != nil {
		k.run.later(msg, "finish the approval", err)
		return
	}
	if rec.State == protocol.StateAwaitingApproval {
		// A command exists only once approved, and settleHeld finished
		// that: this one is not the ledger's.
		_ = msg.Ack()
		return
	}
	if rec.State != protocol.StateDispatched {
		if rec.Claim != nil && rec.Claim.SourceID == protocol.DeadlineSourceID {
			// Timed out by a process that may have stopped before its
			// cancel: store it (once).
			if err := l.cancelAfterTimeout(ctx, rec); err != nil {
				k.run.later(msg, "cancel after timeout", err)
				return
			}
		}
		_ = msg.Ack()
		return
	}
	if rec.DeadlineUnixMS == 0 {
		// A call dispatched by an earlier version: its deadline counts
		// from dispatch as the executor's did from pick-up.
		at := rec.DispatchedAt
		if at.IsZero() {
			if meta, merr := msg.Metadata(); merr == nil {
				at = meta.Timestamp
			}
		}
		registered, err := l.registeredTool(ctx, rec.ProjectID, rec.ToolName)
		if err != nil {
			k.run.later(msg, "read tool definition", err)
			return
		}
		rec.DeadlineUnixMS = at.Add(l.callBudget(registered, rec.ToolName, cmd.Payload.TimeoutMS)).UnixMilli()
	}
	if due := rec.Deadline().Add(l.grace); now.Before(due) {
		_ = msg.NakWithDelay(due.Sub(now))
		return
	}
	if _, err := l.recordTimeout(ctx, rec); err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) && (pe.Code == protocol.CodeConflict || pe.Code == protocol.CodeStaleEpoch) {
			// A report won the race: the call has its outcome.
			_ = msg.Ack()
			return
		}
		k.run.later(msg, "record timeout", err)
		return
	}
	_ = msg.Ack()
}

// ackWhenReported has the command handed back until due acknowledged as
// soon as this process stores its call's report and wakeup (keeperacks.go),
// or at once when it already has: the delivery at due would only find the
// call reported.
func (k *DeadlineKeeper) ackWhenReported(msg jetstream.Msg, due time.Time) {
	l := k.l
	project := protocol.SubjectProject(msg.Subject())
	h := msg.Headers()
	turn, call := protocol.HeaderGet(h, protocol.HeaderAgentTurnID), protocol.HeaderGet(h, protocol.HeaderToolCallID)
	if project == "" || turn == "" || call == "" {
		return
	}
	key := callKey(project, turn, call)
	if !l.keeperAcks.register(key, msg.Reply(), due) {
		return
	}
	if l.reportedHere(key) {
		l.keeperAcks.done(key)
	}
}

// reportedHere reports whether this process's memory holds key's call as
// woken by a report (not by its deadline): its report and wakeup are
// stored, and a report is never taken back.
func (l *Ledger) reportedHere(key string) bool {
	c, ok := l.cache.records.get(key)
	return ok && c.rec.State == protocol.StateWoken && c.rec.Claim != nil && c.rec.Claim.SourceID != protocol.DeadlineSourceID
}

// commandDeadline reads only a command's deadline_unix_ms, 0 when the
// payload has none that the full parse could accept. The keeper delays
// every command to its deadline before anything else and validates it
// fully (protocol.ParseToolCommand) only once due, where it acts: a
// malformed command is still acked unacted on, at its deadline rather than
// at once (docs/decisions.md).
func commandDeadline(data []byte) int64 {
	var p struct {
		DeadlineUnixMS int64 `json:"deadline_unix_ms"`
	}
	if json.Unmarshal(data, &p) != nil || p.DeadlineUnixMS < 1 || p.DeadlineUnixMS > protocol.MaxDeadlineUnixMS {
		return 0
	}
	return p.DeadlineUnixMS
}

// processPrepared keeps a prepared call's commit deadline: at it, with no
// decision stored, the ledger's abort is stored (and so routed to the
// tool). It does not read the call's state, so a call its tool reported
// without waiting for a decision gets the abort too: the tool only acks a
// decision whose call is answered (docs/side-effects.md). A commit racing
// it is decided by the decision subject: exactly one of the two is stored.
func (k *DeadlineKeeper) processPrepared(msg jetstream.Msg) {
	l := k.l
	var prep protocol.PreparedEntry
	if err := json.Unmarshal(msg.Data(), &prep); err != nil || prep.CommitDeadlineUnixMS <= 0 {
		_ = msg.Ack()
		return
	}
	if due := time.UnixMilli(prep.CommitDeadlineUnixMS); time.Now().Before(due) {
		_ = msg.NakWithDelay(time.Until(due))
		return
	}
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.Ack()
		return
	}
	ctx, cancel := context.WithTimeout(k.run.ctx, 30*time.Second)
	defer cancel()
	if _, _, err := l.autoAbort(ctx, meta.Sequence.Stream, &prep); err != nil {
		k.run.later(msg, "abort at the commit deadline", err)
		return
	}
	_ = msg.Ack()
}

// processHeld keeps the deadline of a call held by a paused tool.
func (k *DeadlineKeeper) processHeld(msg jetstream.Msg) {
	ctx, cancel := context.WithTimeout(k.run.ctx, 30*time.Second)
	defer cancel()
	done, delay, err := k.l.keepPausedHeld(ctx, msg.Data())
	switch {
	case err != nil:
		k.run.later(msg, "time out a paused call", err)
	case !done:
		_ = msg.NakWithDelay(delay)
	default:
		_ = msg.Ack()
	}
}

// processPause finishes a resume's release, which the process that
// appended it may not have finished.
func (k *DeadlineKeeper) processPause(msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.Ack()
		return
	}
	ctx, cancel := context.WithTimeout(k.run.ctx, 30*time.Second)
	defer cancel()
	if err := k.l.keepResume(ctx, meta.Sequence.Stream, msg.Data()); err != nil {
		k.run.later(msg, "finish a resume", err)
		return
	}
	_ = msg.Ack()
}
