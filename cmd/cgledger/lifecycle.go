package main

import (
	"context"
	"errors"
	"fmt"
)

// component is one part of a running serve: Start brings it up (after the
// components listed before it), Stop takes it down (before them).
type component interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// group runs components in one order: its list is the start order and,
// reversed, the stop order, so that the order a shutdown follows is written
// once, as the list, and a failed start unwinds exactly what had started.
type group struct {
	parts []namedComponent
	// starting, when set, is told the name of each component before its
	// Start (what /readyz names while serve starts).
	starting func(name string)
}

type namedComponent struct {
	name string
	c    component
}

// add appends c, named for the errors of its stop, to the start order.
func (g *group) add(name string, c component) {
	g.parts = append(g.parts, namedComponent{name: name, c: c})
}

// Run starts every component in order, waits until ctx ends, then stops
// them all in reverse. A start that fails stops the components started
// before it, in reverse, and Run returns that start's error (unwrapped, so
// that callers can tell a cancelled start) joined with any of their stop
// errors. After a full start Run returns the stop errors joined, or nil.
//
// Stop gets a context without ctx's cancellation: each component bounds its
// own stop, and a stop must not be cut short because the signal that began
// it cancelled ctx.
func (g *group) Run(ctx context.Context) error {
	for i, p := range g.parts {
		if g.starting != nil {
			g.starting(p.name)
		}
		if err := p.c.Start(ctx); err != nil {
			if serr := g.stop(ctx, i); serr != nil {
				return errors.Join(err, serr)
			}
			return err
		}
	}
	<-ctx.Done()
	return g.stop(ctx, len(g.parts))
}

// stop stops the first n components in reverse, every one even when an
// earlier stop failed, and joins their errors.
func (g *group) stop(ctx context.Context, n int) error {
	sctx := context.WithoutCancel(ctx)
	var errs []error
	for i := n - 1; i >= 0; i-- {
		if err := g.parts[i].c.Stop(sctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", g.parts[i].name, err))
		}
	}
	return errors.Join(errs...)
}

// hooks is a component made of two functions, either of which may be nil:
// for a part whose start or stop is one step.
type hooks struct {
	start func(ctx context.Context) error
	stop  func(ctx context.Context) error
}

// Start runs the start function, if any.
func (h hooks) Start(ctx context.Context) error {
	if h.start == nil {
		return nil
	}
	return h.start(ctx)
}

// Stop runs the stop function, if any.
func (h hooks) Stop(ctx context.Context) error {
	if h.stop == nil {
		return nil
	}
	return h.stop(ctx)
}
