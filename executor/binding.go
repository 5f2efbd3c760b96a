package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// startBound starts an executor on Config.Bindings: it pulls the consumers
// the ledger keeps for those tools, so its connection needs no JetStream API
// beyond what a tool credential holds (pull and ack of its tool's consumer).
func (e *Executor) startBound(ctx context.Context) error {
	var bad []error
	for i, b := range e.cfg.Bindings {
		if !protocol.ValidIdentifier(b.Project) {
			bad = append(bad, fmt.Errorf("bindings[%d].project %q is not an identifier", i, b.Project))
		}
		if _, ok := e.impls[b.Tool]; !ok {
			bad = append(bad, fmt.Errorf("bindings[%d].tool %q is not a registered implementation", i, b.Tool))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("executor: bindings: %w", errors.Join(bad...))
	}
	apis := map[string]jetstream.JetStream{}
	cancels := map[string]bool{}
	for _, b := range e.cfg.Bindings {
		if err := e.bind(ctx, b, apis, cancels); err != nil {
			e.Stop(ctx)
			return fmt.Errorf("executor: binding %s/%s: %w", b.Project, b.Tool, err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		return fmt.Errorf("executor: flush: %w", err)
	}
	return nil
}

// bind asks the ledger for b's consumer, listens for its project's
// cancellations (once per project) and starts pulling.
func (e *Executor) bind(ctx context.Context, b Binding, apis map[string]jetstream.JetStream, cancels map[string]bool) error {
	tc, err := e.l.EnsureToolConsumer(ctx, b.Project, b.Tool)
	if err != nil {
		return fmt.Errorf("tool consumer: %w", err)
	}
	if len(tc.FilterSubjects) == 0 {
		return fmt.Errorf("tool consumer %s has no filter subjects", tc.Consumer)
	}
	// The version token comes from the ledger's answer: a tool credential
	// may subscribe to its project's cancellations of that version only.
	version, ok := protocol.SubjectVersion(tc.FilterSubjects[0])
	if !ok {
		return fmt.Errorf("tool consumer %s: filter subject %q has no protocol version", tc.Consumer, tc.FilterSubjects[0])
	}
	cancelSubject := protocol.CancelSubjectPattern(version, b.Project)
	if !cancels[cancelSubject] {
		sub, err := e.nc.Subscribe(cancelSubject, e.onCancel)
		if err != nil {
			return fmt.Errorf("subscribe to cancellations: %w", err)
		}
		e.cancelSubs = append(e.cancelSubs, sub)
		cancels[cancelSubject] = true
	}
	js, ok := apis[tc.APIPrefix]
	if !ok {
		if tc.APIPrefix == "" {
			js, err = jetstream.New(e.nc)
		} else {
			js, err = jetstream.NewWithAPIPrefix(e.nc, tc.APIPrefix)
		}
		if err != nil {
			return fmt.Errorf("jetstream with API prefix %q: %w", tc.APIPrefix, err)
		}
		apis[tc.APIPrefix] = js
	}
	cons, err := js.Consumer(ctx, tc.Stream, tc.Consumer)
	if err != nil {
		return fmt.Errorf("bind consumer %s: %w", tc.Consumer, err)
	}
	// Heartbeats go every third of the shorter of Config.AckWait and the
	// consumer's own ack wait (serve's tool_ack_wait, which the ledger
	// sets): by Config.AckWait alone, a consumer with a shorter one would
	// deliver a long call again while it runs.
	ackWait := e.cfg.AckWait
	if info := cons.CachedInfo(); info != nil && info.Config.AckWait > 0 && info.Config.AckWait < ackWait {
		ackWait = info.Config.AckWait
	}
	cc, err := cons.Consume(e.onMsg(e.impls[b.Tool], ackWait), jetstream.PullMaxMessages(e.cfg.MaxInFlight))
	if err != nil {
		return fmt.Errorf("consume %s: %w", tc.Consumer, err)
	}
	e.ccs = append(e.ccs, cc)
	return nil
}
