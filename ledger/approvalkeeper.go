package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// DefaultApprovalDurable prefixes the approval keeper's consumer name
// (cgledger-approvals-v1 for protocol version v1).
const DefaultApprovalDurable = "cgledger-approvals-"

// DefaultApprovalFinishAfter is ApprovalKeeperConfig.FinishAfter's default.
const DefaultApprovalFinishAfter = 10 * time.Second

// ApprovalKeeperConfig configures an ApprovalKeeper.
type ApprovalKeeperConfig struct {
	// Durable is the consumer's name, shared by every serve process.
	// Empty means DefaultApprovalDurable plus the protocol version.
	Durable string
	// AckWait is how long an entry taken by a process that then stops
	// waits before another process gets it. Zero means 30s.
	AckWait time.Duration
	// Workers bounds the entries handled at once. Zero means 16.
	Workers int
	// FinishAfter is how long after a decision the keeper leaves its
	// follow-up to the decider before doing it itself. Zero means
	// DefaultApprovalFinishAfter.
	FinishAfter time.Duration
	// Retry, when set, is asked after the consumer cannot be created: nil
	// to try again, an error to give up with it. Nil gives up at once.
	Retry func(ctx context.Context, step string, err error) error
}

// ApprovalKeeper keeps held calls: a durable pull consumer of the held and
// approval entries. A held entry whose call has no decision at its
// expires_unix_ms gets the ledger's expiry (the decision expired, which
// races approvals through the approval subject like any decision); until
// then it is handed back to the server to be delivered again then. An
// approval entry whose call is still awaiting_approval after FinishAfter
// (its decider stopped half-way) gets its follow-up finished. A redrive
// entry gets its derived call dispatched FinishAfter after it was written
// (a dispatch is idempotent: one done already is answered as such).
type ApprovalKeeper struct {
	l   *Ledger
	cfg ApprovalKeeperConfig
	run keeper
}

// StartApprovalKeeper creates (or binds) the keeper's consumer and starts
// consuming. Stop it with Stop.
func (l *Ledger) StartApprovalKeeper(ctx context.Context, cfg ApprovalKeeperConfig) (*ApprovalKeeper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("approval keeper: %w", err)
	}
	if cfg.Durable == "" {
		cfg.Durable = DefaultApprovalDurable + l.version
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 16
	}
	if cfg.FinishAfter <= 0 {
		cfg.FinishAfter = DefaultApprovalFinishAfter
	}
	k := &ApprovalKeeper{l: l, cfg: cfg}
	err := k.run.start(ctx, keeperSpec{
		name:    "approval keeper",
		log:     l.log,
		workers: cfg.Workers,
		create: l.keeperConsumer("approval keeper", jetstream.ConsumerConfig{
			Durable:     cfg.Durable,
			Description: "cgledger: held calls' expiry, decisions' and redrives' follow-up (serve's approval keeper)",
			// Every held call stays pending until its decision or expiry
			// (up to 7 days).
			FilterSubjects: []string{protocol.CallEntriesFilter(l.version, "*", protocol.SubjectHeld),
				protocol.CallEntriesFilter(l.version, "*", protocol.SubjectApproval), protocol.CallEntriesFilter(l.version, "*", protocol.SubjectRedrive)},
			AckWait: cfg.AckWait,
		}),
		retry:   cfg.Retry,
		process: k.process,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// Stop stops taking entries and waits (up to ctx) for those being handled.
// Entries taken and not handled come back to another process (or this one,
// started again) after AckWait.
func (k *ApprovalKeeper) Stop(ctx context.Context) error {
	return k.run.stop(ctx)
}

// process decides one delivery of a held, approval or redrive entry.
func (k *ApprovalKeeper) process(msg jetstream.Msg) {
	l := k.l
	var ids struct {
		ProjectID   string `json:"project_id"`
		AgentTurnID string `json:"agent_turn_id"`
		ToolCallID  string `json:"tool_call_id"`
	}
	if err := json.Unmarshal(msg.Data(), &ids); err != nil {
		_ = msg.Ack()
		return
	}
	kind := protocol.HeaderGet(msg.Headers(), protocol.HeaderEntryKind)
	now := time.Now()
	if kind == string(protocol.KindRedrive) {
		k.redrive(msg, now)
		return
	}
	if kind == string(protocol.KindHeld) {
		var h protocol.HeldEntry
		if err := json.Unmarshal(msg.Data(), &h); err != nil {
			_ = msg.Ack()
			return
		}
		// The entry carries the expiry: no read until it is due.
		if due := time.UnixMilli(h.ExpiresUnixMS); now.Before(due) {
			_ = msg.NakWithDelay(due.Sub(now))
			return
		}
	}
	ctx, cancel := context.WithTimeout(k.run.ctx, 30*time.Second)
	defer cancel()
	rec, _, err := l.getRecord(ctx, callKey(ids.ProjectID, ids.AgentTurnID, ids.ToolCallID))
	if err != nil {
		k.run.later(msg, "read call record", err)
		return
	}
	if rec == nil || rec.Held == nil || rec.State != protocol.StateAwaitingApproval {
		// Gone with the retention, or decided and followed up.
		_ = msg.Ack()
		return
	}
	decided, seq, err := l.decisionOf(ctx, rec)
	if err != nil {
		k.run.later(msg, "read decision", err)
		return
	}
	if decided == nil {
		if kind != string(protocol.KindHeld) {
			_ = msg.Ack()
			return
		}
		won := false
		decided, seq, won, err = l.decide(ctx, nil, rec, protocol.ApprovalExpired, protocol.ApprovalExpirySource, "")
		if err != nil {
			k.run.later(msg, "record expiry", err)
			return
		}
		if won {
			if err := l.step(stepApprovalDecided); err != nil {
				k.run.later(msg, "record expiry", err)
				return
			}
		}
	} else if age := now.Sub(time.UnixMilli(decided.DecidedUnixMS)); age < k.cfg.FinishAfter {
		// Its decider is likely finishing it: look again after a while.
		_ = msg.NakWithDelay(k.cfg.FinishAfter - age)
		return
	}
	if _, err := l.finishDecision(ctx, rec, decided, seq); err != nil {
		k.run.later(msg, "finish the decision", err)
		return
	}
	_ = msg.Ack()
}

// redrive finishes a redrive entry's dispatch once its operator's request
// had FinishAfter to do it: the dispatch is idempotent, so it is simply
// dispatched again. A refusal of that dispatch (the stored one can never
// be taken) is logged and not retried: each retry would record another.
func (k *ApprovalKeeper) redrive(msg jetstream.Msg, now time.Time) {
	var e protocol.RedriveEntry
	if err := json.Unmarshal(msg.Data(), &e); err != nil {
		_ = msg.Ack()
		return
	}
	if age := now.Sub(time.UnixMilli(e.RedrivenUnixMS)); age < k.cfg.FinishAfter {
		_ = msg.NakWithDelay(k.cfg.FinishAfter - age)
		return
	}
	ctx, cancel := context.WithTimeout(k.run.ctx, 30*time.Second)
	defer cancel()
	// A call gone with the retention is not redriven again: a new keeper
	// consumer reads every redrive entry still in the stream.
	rec, _, err := k.l.getRecord(ctx, callKey(e.ProjectID, e.AgentTurnID, e.ToolCallID))
	if err != nil {
		k.run.later(msg, "read call record", err)
		return
	}
	if rec == nil {
		_ = msg.Ack()
		return
	}
	if _, err := k.l.dispatchRedrive(ctx, &e); err != nil {
		if _, refused := protocol.AsError(err); refused {
			k.l.log.Error("approval keeper: the dispatch of a redrive's derived call is refused", "project", e.ProjectID, "turn", e.AgentTurnID, "call", e.ToolCallID, "redrive_call", e.RedriveCallID, "err", err)
			_ = msg.Ack()
			return
		}
		k.run.later(msg, "dispatch a redrive's derived call", err)
		return
	}
	_ = msg.Ack()
}
