// Package backoff is the module's one retry delay: doubling from a first
// delay up to a cap, waited on a context. Every retry loop of the ledger,
// the projector, the archive and serve uses it.
package backoff

import (
	"context"
	"time"
)

// Doubling is a delay that doubles from First up to Max each time it is
// waited. The zero value waits nothing; it is not safe for concurrent use.
type Doubling struct {
	next, max time.Duration
}

// New returns a Doubling whose first delay is first and whose delays never
// exceed max.
func New(first, max time.Duration) *Doubling {
	return &Doubling{next: min(first, max), max: max}
}

// Next is the delay the next Wait waits.
func (d *Doubling) Next() time.Duration { return d.next }

// Wait waits the next delay, then doubles it. It returns ctx's error, at
// once, when ctx ends first.
func (d *Doubling) Wait(ctx context.Context) error { return d.wait(ctx, d.next) }

// WaitUntil is Wait that stops waiting just past deadline: a caller polling
// for something until a deadline looks once more right after it.
func (d *Doubling) WaitUntil(ctx context.Context, deadline time.Time) error {
	return d.wait(ctx, min(d.next, time.Until(deadline)+time.Millisecond))
}

func (d *Doubling) wait(ctx context.Context, wait time.Duration) error {
	d.next = min(2*d.next, d.max)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
