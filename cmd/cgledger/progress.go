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
	now := time.Now()
	if now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	elapsed := now.Sub(p.start)
	line := fmt.Sprintf("%s: %d", p.name, done)
	if total > 0 {
		line += fmt.Sprintf("/%d", total)
		frac = float64(done) / float64(total)
	}
	line += " " + unit
	rate := float64(done) / elapsed.Seconds()
	if elapsed > 0 {
		line += fmt.Sprintf(", %.0f/s", rate)
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

// done ends the progress line on a terminal.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
