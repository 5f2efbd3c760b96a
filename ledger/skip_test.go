package ledger_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

func (e *env) stream(t *testing.T) jetstream.Stream {
	t.Helper()
	js, err := jetstream.New(e.nc)
	require.NoError(t, err)
	s, err := js.Stream(ctxT(t), stream.DefaultName)
	require.NoError(t, err)
	return s
}

// lastSeq is the ledger stream's last sequence.
func (e *env) lastSeq(t *testing.T) uint64 {
	t.Helper()
	info, err := e.stream(t).Info(ctxT(t))
	require.NoError(t, err)
	return info.State.LastSeq
}

func (e *env) publishRaw(t *testing.T, subject string, h nats.Header, data string) uint64 {
	t.Helper()
	js, err := jetstream.New(e.nc)
	require.NoError(t, err)
	ack, err := js.PublishMsg(ctxT(t), &nats.Msg{Subject: subject, Header: h, Data: []byte(data)})
	require.NoError(t, err)
	return ack.Sequence
}

func requireViolation(t *testing.T, err error, field, code, msgPart string) {
	t.Helper()
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	e, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	for _, v := range e.Violations {
		if v.Field == field && v.Code == code && strings.Contains(v.Message, msgPart) {
			return
		}
	}
	require.Failf(t, "violation not found", "want %s/%s containing %q in %+v", field, code, msgPart, e.Violations)
}

// TestSkipValidatesAppendsOnceAndIsFound covers Ledger.Skip end to end on a
// real stream: its refusals, the entry it writes, idempotence, conflicts,
// and FindSkip reading it back.
func TestSkipValidatesAppendsOnceAndIsFound(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	target := e.publishRaw(t, "cg.v1.p.c.ledger.report.t.c", nats.Header{protocol.HeaderEntryKind: {"report"}}, "not json")
	last := e.lastSeq(t)

	_, err := e.l.Skip(ctx, last+1, "ahead")
	requireViolation(t, err, "seq", protocol.VInvalidValue, "sequence 2 is past the end of the ledger (last seq 1)")
	_, err = e.l.Skip(ctx, 0, "zero")
	requireViolation(t, err, "seq", protocol.VInvalidValue, "at least 1")
	_, err = e.l.Skip(ctx, target, "")
	requireViolation(t, err, "reason", protocol.VRequired, "needs a reason")
	_, err = e.l.Skip(ctx, target, strings.Repeat("x", protocol.MaxSkipReason+1))
	requireViolation(t, err, "reason", protocol.VTooLarge, "at most")
	_, err = e.l.Skip(ctx, target, "\xff")
	requireViolation(t, err, "reason", protocol.VInvalidValue, "UTF-8")
	require.Equal(t, last, e.lastSeq(t), "refusals append nothing")

	// A stray message on the skip subject (not a valid skip) neither counts
	// as the skip nor blocks the operator's.
	stray := e.publishRaw(t, protocol.SkipSubject("v1", target), nats.Header{protocol.HeaderEntryKind: {"skip"}}, `{"seq":99,"reason":"x"}`)
	_, found, err := stream.FindSkip(ctx, e.stream(t), target)
	require.NoError(t, err)
	require.False(t, found, "a skip whose data names another sequence is not a skip")

	const reason = "operator: corrupt report from build 1.2.3"
	res, err := e.l.Skip(ctx, target, reason)
	require.NoError(t, err)
	require.Equal(t, protocol.SkipResult{Seq: target, SkipSeq: stray + 1, Reason: reason, Subject: "cg.v1.p.c.ledger.report.t.c"}, res)

	msgs := e.subjectEntries(t, protocol.SkipSubject("v1", target))
	require.Len(t, msgs, 2)
	m := msgs[1]
	require.Equal(t, "skip", m.Header.Get(protocol.HeaderEntryKind))
	require.NotEmpty(t, m.Header.Get(protocol.HeaderTime))
	require.JSONEq(t, `{"seq":1,"reason":"operator: corrupt report from build 1.2.3","subject":"cg.v1.p.c.ledger.report.t.c"}`, string(m.Data))
	require.False(t, protocol.RecognizeEntry(m.Subject, m.Header).Unrecognized())

	rec, found, err := stream.FindSkip(ctx, e.stream(t), target)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, res.SkipSeq, rec.SkipSeq)
	require.Equal(t, reason, rec.Reason)
	require.False(t, rec.Time.IsZero())

	dup, err := e.l.Skip(ctx, target, reason)
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	require.Equal(t, res.SkipSeq, dup.SkipSeq)
	_, err = e.l.Skip(ctx, target, "a different reason")
	require.ErrorIs(t, err, protocol.ErrConflict)
	require.Contains(t, err.Error(), "already skipped by entry")
	lastAfter := e.lastSeq(t)

	// Concurrent identical skips of another sequence write one entry.
	var wg sync.WaitGroup
	results := make([]protocol.SkipResult, 8)
	errs := make([]error, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = e.l.Skip(ctx, stray, "stray message")
		}()
	}
	wg.Wait()
	written := 0
	for i := range results {
		require.NoError(t, errs[i])
		require.Equal(t, lastAfter+1, results[i].SkipSeq)
		if !results[i].Duplicate {
			written++
		}
	}
	require.Equal(t, 1, written)
	require.Equal(t, lastAfter+1, e.lastSeq(t))
}

// TestRecognizeEntry pins which messages are ledger entries.
func TestRecognizeEntry(t *testing.T) {
	kind := func(k string) nats.Header { return nats.Header{protocol.HeaderEntryKind: {k}} }
	cases := []struct {
		subject string
		h       nats.Header
		kind    string
		code    string
	}{
		{"cg.v1.p.card.x", kind("card"), "card", ""},
		{"cg.v1.p.c.cmd.tool.echo", kind("command"), "command", ""},
		{"cg.v1.p.c.cmd.tool.echo", nil, "command", ""},
		{"cg.v1.p.c.cmd.agent.w.wakeup", nil, protocol.ViewKindExternalWakeup, ""},
		{"cg.v1._._.ledger.rejection.bad_request", kind("rejection"), "rejection", ""},
		{"cg.v1._._.ledger.skip.3", kind("skip"), "skip", ""},
		{"cg.v1.p.c.ledger.report.t.c", kind("bogus"), protocol.ViewKindUnrecognized, protocol.UnrecognizedUnknownKind},
		{"cg.v1.p.c.ledger.report.t.c", kind("external_wakeup"), protocol.ViewKindUnrecognized, protocol.UnrecognizedUnknownKind},
		{"cg.v1.p.c.ledger.report.t.c", kind("unrecognized"), protocol.ViewKindUnrecognized, protocol.UnrecognizedUnknownKind},
		{"cg.v1.p.c.ledger.report.t.c", nil, protocol.ViewKindUnrecognized, protocol.UnrecognizedNoKind},
		{"cg.x", nil, protocol.ViewKindUnrecognized, protocol.UnrecognizedOutsideGrammar},
		{"cg.v1.p.c.what.ever", kind("card"), protocol.ViewKindUnrecognized, protocol.UnrecognizedOutsideGrammar},
		{"cg.v1.p.card.x", kind("report"), protocol.ViewKindUnrecognized, protocol.UnrecognizedKindMismatch},
		{"cg.v1.p.c.ledger.skip.3", kind("skip"), protocol.ViewKindUnrecognized, protocol.UnrecognizedOutsideGrammar},
	}
	for _, c := range cases {
		r := protocol.RecognizeEntry(c.subject, c.h)
		require.Equal(t, c.kind, r.Kind, "%s %v: %s", c.subject, c.h, r.Reason)
		require.Equal(t, c.code, r.Code, "%s %v: %s", c.subject, c.h, r.Reason)
		require.Equal(t, c.code != "", r.Unrecognized())
		require.Equal(t, c.code != "", r.Reason != "")
	}
}
