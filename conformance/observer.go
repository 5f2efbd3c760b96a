package conformance

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/protocol"
)

// observer follows the project's entries from the run's start and the tool's
// consumers, through conformance.observe.
type observer struct {
	c             *client.Client
	project, tool string
	next          uint64
	entries       []protocol.Entry
	consumers     []protocol.ConformanceConsumer
}

// pollGap is the pause between two reads of a wait: a wait is on a condition
// with a deadline, never a sleep standing in for one.
const pollGap = 100 * time.Millisecond

// start reads the ledger's last sequence: the run sees entries after it.
func (o *observer) start(ctx context.Context) error {
	res, err := o.c.ConformanceObserve(ctx, protocol.ConformanceObserveRequest{ProjectID: o.project, Tool: o.tool, FromSeq: math.MaxInt64})
	if err != nil {
		return fmt.Errorf("conformance.observe: %w", err)
	}
	o.next, o.consumers = res.LastSeq+1, res.Consumers
	return nil
}

// poll reads the entries written since the last poll and the consumers.
func (o *observer) poll(ctx context.Context) error {
	for {
		res, err := o.c.ConformanceObserve(ctx, protocol.ConformanceObserveRequest{ProjectID: o.project, Tool: o.tool, FromSeq: o.next})
		if err != nil {
			return fmt.Errorf("conformance.observe: %w", err)
		}
		o.entries = append(o.entries, res.Entries...)
		o.consumers = res.Consumers
		if res.NextSeq > o.next {
			o.next = res.NextSeq
		}
		if !res.Truncated {
			return nil
		}
	}
}

// waitFor polls until cond holds or d passes; ok says which.
func (o *observer) waitFor(ctx context.Context, d time.Duration, cond func() bool) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		if err := o.poll(ctx); err != nil {
			return false, err
		}
		if cond() {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		t := time.NewTimer(pollGap)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
	}
}

// ackedUpTo: some consumer of the tool acknowledged every command up to seq.
func (o *observer) ackedUpTo(seq uint64) bool {
	for _, c := range o.consumers {
		if c.AckFloorStreamSeq >= seq {
			return true
		}
	}
	return false
}

func (o *observer) consumerSummary() string {
	var b []string
	for _, c := range o.consumers {
		b = append(b, fmt.Sprintf("%s ack floor %d, delivered %d, ack pending %d", c.Name, c.AckFloorStreamSeq, c.DeliveredStreamSeq, c.NumAckPending))
	}
	return strings.Join(b, "; ")
}

// about returns the entries of the run that concern turn: on its subjects,
// in its headers, or naming it in their data (cards, rejections).
func (o *observer) about(turn string) []protocol.Entry {
	var out []protocol.Entry
	quoted := `"` + turn + `"`
	for _, e := range o.entries {
		h := nats.Header(e.Headers)
		if strings.Contains(e.Subject, "."+turn+".") || h.Get(protocol.HeaderAgentTurnID) == turn || strings.Contains(string(e.Data), quoted) {
			out = append(out, e)
		}
	}
	return out
}

func (o *observer) bySeq(seq uint64) *protocol.Entry {
	for i := range o.entries {
		if o.entries[i].Seq == seq {
			return &o.entries[i]
		}
	}
	return nil
}

func entryKind(e protocol.Entry) string { return nats.Header(e.Headers).Get(protocol.HeaderEntryKind) }

func kindOf(es []protocol.Entry, k protocol.EntryKind) []protocol.Entry {
	var out []protocol.Entry
	for _, e := range es {
		if entryKind(e) == string(k) {
			out = append(out, e)
		}
	}
	return out
}
