package ledger

import (
	"context"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
)

// Step names a point in the report path (the report and dispatch steps of
// docs/report-path.md), for fault-injection tests.
type Step = step

// The steps, in order.
const (
	StepAppended             = stepAppended
	StepWoken                = stepWoken
	StepMarkedWoken          = stepMarkedWoken
	StepResultChecked        = stepResultChecked
	StepDispatchCard         = stepDispatchCard
	StepDispatchRecord       = stepDispatchRecord
	StepDispatchRecordExists = stepDispatchRecordExists
	StepDispatchCommand      = stepDispatchCommand
	StepHeld                 = stepHeld
	StepApprovalDecided      = stepApprovalDecided
	StepApprovalCommand      = stepApprovalCommand
	StepApprovalWoken        = stepApprovalWoken
	StepPauseHeld            = stepPauseHeld
	StepResumed              = stepResumed
	StepResumeReleased       = stepResumeReleased
	StepRedriveEntry         = stepRedriveEntry
)

// SetAfterStep installs the report-path fault-injection hook (tests only).
func (l *Ledger) SetAfterStep(f func(Step) error) { l.afterStep.Store(&f) }

// SetReportLease shortens the report lease (tests of crashes, where the
// retry must wait it out, as a new process would).
func (l *Ledger) SetReportLease(d time.Duration) { l.lease = d }

// The raw forms of the write operations, as the API server calls them with a
// request's headers and body as received (tests of input validation); the
// caller is the one ctx carries (WithCaller), read here as the API handler
// reads its subject's.
var (
	DispatchMsg = func(l *Ledger, ctx context.Context, h nats.Header, body []byte) (protocol.DispatchResult, error) {
		return l.dispatchMsg(ctx, callerOf(ctx), nil, h, body)
	}
	ReportMsg = func(l *Ledger, ctx context.Context, h nats.Header, data []byte) (protocol.ReportOutcome, error) {
		return l.reportMsg(ctx, callerOf(ctx), h, data)
	}
	PutCardJSON = func(l *Ledger, ctx context.Context, data []byte) (protocol.PutCardResult, error) {
		return l.putCardJSON(ctx, callerOf(ctx), data)
	}
	CancelJSON = func(l *Ledger, ctx context.Context, body []byte) (protocol.CancelResult, error) {
		return l.cancelJSON(ctx, callerOf(ctx), body)
	}
	ConsumeJSON = func(l *Ledger, ctx context.Context, body []byte) (protocol.ConsumeResult, error) {
		return l.consumeJSON(ctx, callerOf(ctx), body)
	}
	SetRosterJSON = func(l *Ledger, ctx context.Context, body []byte) (protocol.RosterResult, error) {
		return l.setRosterJSON(ctx, callerOf(ctx), body)
	}
	ApprovalJSON = func(l *Ledger, ctx context.Context, op, approver string, body []byte) (protocol.ApprovalResult, error) {
		return l.approvalJSON(ctx, callerOf(ctx), op, approver, body)
	}
)
