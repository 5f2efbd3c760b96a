package protocol

import (
	"fmt"

	"github.com/nats-io/nats.go"
)

// View kinds of stream messages that are not entries the ledger wrote but
// that the projector still interprets (docs/views.md).
const (
	// ViewKindExternalWakeup is a wakeup published on a wakeup subject by
	// someone other than the ledger (no CG-Entry-Kind).
	ViewKindExternalWakeup = "external_wakeup"
	// ViewKindUnrecognized is any stream message the projector cannot
	// interpret as a ledger entry. It is a view concept, never a
	// CG-Entry-Kind.
	ViewKindUnrecognized = "unrecognized"
)

// Codes saying why a stream message is unrecognized. They are stable: the
// views store them, so a rewording must not change a replay's digest.
const (
	UnrecognizedUnknownKind    = "unknown_kind"    // CG-Entry-Kind is not a kind this build knows
	UnrecognizedNoKind         = "no_kind"         // no CG-Entry-Kind, on a subject others may not publish to
	UnrecognizedOutsideGrammar = "outside_grammar" // the subject is not in the ledger grammar
	UnrecognizedKindMismatch   = "kind_mismatch"   // a known CG-Entry-Kind on another kind's subject
)

// Recognition is how the projector reads one stream message.
type Recognition struct {
	// Kind is the view kind: the CG-Entry-Kind of a ledger entry,
	// KindCommand for a command published by others, ViewKindExternalWakeup,
	// or ViewKindUnrecognized.
	Kind string
	// Code and Reason say why the message is unrecognized (empty otherwise):
	// Code is one of the Unrecognized* codes, Reason explains it to people.
	Code   string
	Reason string
}

// Unrecognized reports whether the message is not a ledger entry.
func (r Recognition) Unrecognized() bool { return r.Code != "" }

// entrySubjects are the subject kinds each entry kind is written on.
var entrySubjects = map[EntryKind][]SubjectKind{
	KindCard:          {SubjectCard},
	KindCommand:       {SubjectToolCommand, SubjectPMOCommand},
	KindReport:        {SubjectReport},
	KindDuplicate:     {SubjectDuplicate},
	KindWakeup:        {SubjectWakeup},
	KindWakeupSkipped: {SubjectWakeupSkip},
	KindRejection:     {SubjectRejection},
	KindRoster:        {SubjectRoster},
	KindConsumed:      {SubjectConsumed},
	KindTool:          {SubjectTool},
	KindCancel:        {SubjectCancel},
	KindSkip:          {SubjectSkip},
	KindAttempt:       {SubjectAttempt},
	KindPrepared:      {SubjectPrepared},
	KindDecision:      {SubjectToolCommand},
	KindHeld:          {SubjectHeld},
	KindApproval:      {SubjectApproval},
	KindResolution:    {SubjectResolution},
	KindToolPause:     {SubjectPause},
	KindRedrive:       {SubjectRedrive},
}

// RecognizeEntry classifies a stream message by its subject and
// CG-Entry-Kind header alone (never its data), so the projector and both
// verifiers agree on which messages are unrecognized. A known kind whose
// data does not decode is not unrecognized: it is a corrupt entry, which
// stops the projector until an operator skips it.
//
// Header names are matched case-insensitively, as the chain hashes them.
func RecognizeEntry(subject string, h nats.Header) Recognition {
	kind, _ := HeaderValue(h, HeaderEntryKind)
	sub, err := ParseSubject(subject)
	unrec := func(code, format string, args ...any) Recognition {
		return Recognition{Kind: ViewKindUnrecognized, Code: code, Reason: fmt.Sprintf(format, args...)}
	}
	if kind == "" {
		switch {
		case err != nil:
			return unrec(UnrecognizedOutsideGrammar, "no CG-Entry-Kind, and subject %q is not in the ledger grammar", Clip(subject))
		case sub.IsCommand():
			// L0 commands may be published by others than the ledger.
			return Recognition{Kind: string(KindCommand)}
		case sub.Kind == SubjectWakeup:
			return Recognition{Kind: ViewKindExternalWakeup}
		}
		return unrec(UnrecognizedNoKind, "no CG-Entry-Kind on a %s subject, which only the ledger writes", sub.Kind)
	}
	if !knownKinds[EntryKind(kind)] {
		return unrec(UnrecognizedUnknownKind, "unknown CG-Entry-Kind %q", Clip(kind))
	}
	if err != nil {
		return unrec(UnrecognizedOutsideGrammar, "CG-Entry-Kind %q on subject %q, which is not in the ledger grammar", kind, Clip(subject))
	}
	for _, k := range entrySubjects[EntryKind(kind)] {
		if sub.Kind == k {
			return Recognition{Kind: kind}
		}
	}
	return unrec(UnrecognizedKindMismatch, "CG-Entry-Kind %q on a %s subject", kind, sub.Kind)
}
