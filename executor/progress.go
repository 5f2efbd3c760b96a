package executor

import (
	"sync"
	"time"
)

// Progress is one progress report of a running call: how far it got of
// how much (Total 0 when unknown) and what it is doing. A tool that learns
// of progress (an MCP server's notifications/progress, say) hands it to
// Call.Progress.
type Progress struct {
	Progress float64 `json:"progress"`
	Total    float64 `json:"total,omitempty"`
	Message  string  `json:"message,omitempty"`
	// AtUnixMS is when the executor received the report.
	AtUnixMS int64 `json:"at_unix_ms"`
}

// Progress recording limits: a chatty tool neither floods JetStream with
// acks nor grows its result card without bound.
const (
	// ProgressEvery is the least time between two heartbeats a call's
	// progress sends, and between two progress reports it keeps.
	ProgressEvery = time.Second
	// MaxProgressKept bounds the progress reports kept for a call's result
	// card; past it the last one is replaced, so the latest is always kept.
	MaxProgressKept = 20
)

// progressLog is a call's progress: it heartbeats the command and keeps a
// rate-limited record for the result card. Safe for concurrent use, since
// a tool reports progress from whatever goroutine it learns of it on.
type progressLog struct {
	beat func()

	mu       sync.Mutex
	lastBeat time.Time
	lastKept time.Time
	kept     []Progress
	// latest is the newest report when it was not kept (rate limited): it
	// joins the record when the record is read, so the last word is never
	// lost.
	latest  *Progress
	dropped int
}

func newProgressLog(beat func()) *progressLog { return &progressLog{beat: beat} }

func (l *progressLog) add(p Progress, now time.Time) {
	p.AtUnixMS = now.UnixMilli()
	l.mu.Lock()
	beat := now.Sub(l.lastBeat) >= ProgressEvery
	if beat {
		l.lastBeat = now
	}
	switch {
	case now.Sub(l.lastKept) < ProgressEvery:
		if l.latest != nil {
			l.dropped++
		}
		l.latest = &p
	case len(l.kept) >= MaxProgressKept:
		l.dropped++
		l.kept[len(l.kept)-1] = p
		l.latest, l.lastKept = nil, now
	default:
		if l.latest != nil {
			l.dropped++
		}
		l.kept = append(l.kept, p)
		l.latest, l.lastKept = nil, now
	}
	l.mu.Unlock()
	if beat && l.beat != nil {
		l.beat()
	}
}

// snapshot is the record: the kept reports, then the latest if it was not
// kept (replacing the last kept one at the cap).
func (l *progressLog) snapshot() []Progress {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]Progress(nil), l.kept...)
	if l.latest != nil {
		if len(out) >= MaxProgressKept {
			out[len(out)-1] = *l.latest
		} else {
			out = append(out, *l.latest)
		}
	}
	return out
}

// Progress reports the call's progress. It heartbeats the command at once
// (at most every ProgressEvery), so JetStream sees the call alive between
// the executor's own heartbeats, and records it: the reports (at most one
// per ProgressEvery, at most MaxProgressKept, the latest always) go into a
// failed, timed out or canceled call's result card as error.detail.progress;
// a successful tool puts ProgressLog in its own output if it wants them
// kept. Safe for concurrent use; a no-op on a Call the executor did not
// make.
func (c *Call) Progress(p Progress) {
	if c.progress != nil {
		c.progress.add(p, time.Now())
	}
}

// ProgressLog returns the progress recorded so far (see Progress).
func (c *Call) ProgressLog() []Progress { return c.progress.snapshot() }
