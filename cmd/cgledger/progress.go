package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress tells a person how a long operation goes, on standard error: on
// a terminal one line rewritten in place at most five times a second,
// elsewhere (a log, CI) one line every few seconds. Quiet prints nothing.
type progress struct {
	w     io.Writer
	name  string
	tty   bool
	quiet bool
	every time.Duration

	mu    sync.Mutex
	start time.Time
	last  time.Time
	drawn bool
	// latest is the last update, printed what was last written.
	latest, printed progressState
}

func newProgress(name string, quiet bool) *progress {
	tty := false
	if st, err := os.Stderr.Stat(); err == nil {
		tty = st.Mode()&os.ModeCharDevice != 0
	}
	every := 3 * time.Second
	if tty {
		every = 200 * time.Millisecond
	}
	return &progress{w: os.Stderr, name: name, tty: tty, quiet: quiet, every: every, start: time.Now()}
}

// update reports done of total units (total 0: unknown); frac, when
// positive, is the share done when units do not say it (bytes of a file).
func (p *progress) update(done, total uint64, unit string, frac float64) {
	if p.quiet {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latest = progressState{done: done, total: total, unit: unit, frac: frac, set: true}
	now := time.Now()
	if now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	p.print(now)
}

// progressState is one update's figures.
type progressState struct {
	done, total uint64
	unit        string
	frac        float64
	set         bool
}

// print writes the latest update; p.mu is held.
func (p *progress) print(now time.Time) {
	st := p.latest
	p.printed = st
	elapsed := now.Sub(p.start)
	line := fmt.Sprintf("%s: %d", p.name, st.done)
	frac := st.frac
	if st.total > 0 {
		line += fmt.Sprintf("/%d", st.total)
		frac = float64(st.done) / float64(st.total)
	}
	line += " " + st.unit
	if elapsed > 0 {
		line += fmt.Sprintf(", %.0f/s", float64(st.done)/elapsed.Seconds())
	}
	if frac > 0 && frac <= 1 {
		line += fmt.Sprintf(", %.0f%%", 100*frac)
		if frac < 1 {
			eta := time.Duration(float64(elapsed) * (1 - frac) / frac).Round(time.Second)
			line += fmt.Sprintf(", about %s left", eta)
		}
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.drawn = true
		return
	}
	fmt.Fprintln(p.w, line)
}

// done prints the last update if the rate limit held it back (so the
// final line says where the operation ended) and ends the line on a
// terminal.
func (p *progress) done() {
	if p.quiet {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latest.set && p.latest != p.printed {
		p.print(time.Now())
	}
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
