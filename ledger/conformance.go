package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// ConformanceCommand appends the tool command an admin describes for a
// conformance run (conformance.command; docs/protocol.md): the headers and
// payload as given, marked with CG-Conformance and CG-Conformance-Case, so a
// tool service can be driven through commands no dispatch would publish
// while only the ledger writes the ledger. The command is not a dispatch: it
// creates no call record and is never held by a pause.
func (l *Ledger) ConformanceCommand(ctx context.Context, actor string, req protocol.ConformanceCommandRequest) (protocol.ConformanceCommandResult, error) {
	// Its headers and payload are checked by the parser alone (header
	// names, sizes, reserved headers): a typed request always takes it.
	by := atEdge(ctx, req.ProjectID, actor)
	return viaWire(ctx, protocol.OpConformanceCommand, req, func(ctx context.Context, body []byte) (protocol.ConformanceCommandResult, error) {
		return l.conformanceCommandJSON(ctx, by, body)
	})
}

func (l *Ledger) conformanceCommandJSON(ctx context.Context, by *protocol.Caller, body []byte) (protocol.ConformanceCommandResult, error) {
	op := protocol.OpConformanceCommand
	req, vs := protocol.ParseConformanceCommand(body)
	if len(vs) > 0 {
		e := protocol.NewError(protocol.CodeBadRequest, vs, "invalid %s: %d violation(s)", op, len(vs))
		return protocol.ConformanceCommandResult{}, l.reject(ctx, by, op, req.ProjectID, protocol.Unrouted, e, protocol.NewRejectedRequest("", nil, body))
	}
	msg := &nats.Msg{Subject: req.Subject, Data: req.Payload, Header: nats.Header{}}
	for k, v := range req.Headers {
		msg.Header[k] = append([]string(nil), v...)
	}
	msg.Header.Set(protocol.HeaderConformance, req.Run)
	msg.Header.Set(protocol.HeaderConformanceCase, req.Case)
	// The key a dispatch's command carries, when the headers name a call:
	// a copy of a real command must look like its redelivery.
	turn, call := protocol.HeaderGet(msg.Header, protocol.HeaderAgentTurnID), protocol.HeaderGet(msg.Header, protocol.HeaderToolCallID)
	if protocol.ValidIdentifier(turn) && protocol.ValidIdentifier(call) {
		msg.Header.Set(protocol.HeaderIdempotencyKey, protocol.IdempotencyKey(req.ProjectID, turn, call))
	}
	msg.Header.Set(protocol.HeaderMsgID, protocol.ConformanceMsgID(req.ProjectID, req.Run, req.Case))
	ack, err := l.appendEntry(ctx, by, protocol.KindCommand, msg)
	if err != nil {
		return protocol.ConformanceCommandResult{}, fmt.Errorf("%s: append: %w", op, err)
	}
	return protocol.ConformanceCommandResult{Seq: ack.Sequence, Subject: req.Subject, Duplicate: ack.Duplicate}, nil
}

// observeDirect: fewer new entries than this are read one by one.
const observeDirect = 256

// errObserveFull stops a read at MaxObserveEntries.
var errObserveFull = errors.New("observe: page full")

// ConformanceObserve answers conformance.observe: the project's entries
// from req.FromSeq on and the durable consumers that deliver req.Tool's
// commands, so a checker can tell that a service acknowledged a command
// (and what it wrote for it) without sleeping.
func (l *Ledger) ConformanceObserve(ctx context.Context, req protocol.ConformanceObserveRequest) (protocol.ConformanceObserveResult, error) {
	res := protocol.ConformanceObserveResult{Entries: []protocol.Entry{}, Consumers: []protocol.ConformanceConsumer{}}
	if req.Tool != "" {
		cs, err := l.toolConsumers(ctx, req.ProjectID, req.Tool)
		if err != nil {
			return res, err
		}
		res.Consumers = cs
	}
	mine := protocol.ProjectEntryPrefix(l.version, req.ProjectID)
	unrouted := protocol.UnroutedEntryPrefix(l.version)
	info, err := l.stream.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("%s: read the stream's state: %w", protocol.OpConformanceObserve, err)
	}
	last := info.State.LastSeq
	res.LastSeq, res.NextSeq = last, max(last+1, req.FromSeq)
	keep := func(e protocol.Entry) error {
		res.NextSeq = e.Seq + 1
		switch {
		case strings.HasPrefix(e.Subject, mine):
		case strings.HasPrefix(e.Subject, unrouted) && nats.Header(e.Headers).Get(protocol.HeaderProjectID) == req.ProjectID:
		default:
			return nil
		}
		res.Entries = append(res.Entries, e)
		if len(res.Entries) >= protocol.MaxObserveEntries && e.Seq < last {
			return errObserveFull
		}
		return nil
	}
	switch {
	case req.FromSeq > last:
		// Nothing new: a checker polls often, and reads nothing then.
	case last-req.FromSeq < observeDirect:
		// A few entries (a checker's poll): read them one by one rather
		// than make a consumer per poll.
		for seq := req.FromSeq; seq <= last; seq++ {
			m, err := l.stream.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				res.NextSeq = seq + 1
				continue
			}
			if err != nil {
				return res, fmt.Errorf("%s: read entry %d: %w", protocol.OpConformanceObserve, seq, err)
			}
			if err := keep(protocol.Entry{Seq: m.Sequence, Subject: m.Subject, Headers: m.Header, Data: m.Data, Time: m.Time}); err != nil {
				res.Truncated = true
				break
			}
		}
	default:
		_, err := l.ReadEntries(ctx, req.FromSeq, func(e protocol.Entry) error {
			if e.Seq > last {
				return errObserveFull
			}
			return keep(e)
		})
		switch {
		case errors.Is(err, errObserveFull):
			res.Truncated = res.NextSeq <= last
		case err != nil:
			return res, fmt.Errorf("%s: read entries: %w", protocol.OpConformanceObserve, err)
		}
	}
	return res, nil
}

// toolConsumers lists the ledger stream's durable consumers that deliver
// the commands of tool target tool in project (the ledger-kept one of
// tool.consumer, an in-process executor's): those whose filters take the
// tool's command subject and no other tool's.
func (l *Ledger) toolConsumers(ctx context.Context, project, tool string) ([]protocol.ConformanceConsumer, error) {
	mine := protocol.ToolCommandSubject(l.version, project, "c", tool)
	other := protocol.ToolCommandSubject(l.version, project, "c", tool+"-not")
	out := []protocol.ConformanceConsumer{}
	lister := l.stream.ListConsumers(ctx)
	for ci := range lister.Info() {
		filters := ci.Config.FilterSubjects
		if ci.Config.FilterSubject != "" {
			filters = append(filters, ci.Config.FilterSubject)
		}
		if ci.Config.Durable == "" || !anyMatch(filters, mine) || anyMatch(filters, other) {
			continue
		}
		out = append(out, protocol.ConformanceConsumer{
			Name: ci.Name, AckFloorStreamSeq: ci.AckFloor.Stream, DeliveredStreamSeq: ci.Delivered.Stream,
			DeliveredConsumerSeq: ci.Delivered.Consumer, NumAckPending: ci.NumAckPending, NumRedelivered: ci.NumRedelivered,
			NumPending: ci.NumPending, NumWaiting: ci.NumWaiting, AckWaitMS: ci.Config.AckWait.Milliseconds(),
		})
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, fmt.Errorf("%s: list consumers: %w", protocol.OpConformanceObserve, err)
	}
	return out, nil
}

// anyMatch reports whether a filter (with NATS wildcards) takes subject.
func anyMatch(filters []string, subject string) bool {
	for _, f := range filters {
		if protocol.FilterMatches(f, subject) {
			return true
		}
	}
	return false
}
