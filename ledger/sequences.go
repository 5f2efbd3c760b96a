package ledger

import (
	"context"
	"sync"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// sequencesDelay is how long a dispatch's sequence write waits. The call's
// report usually marks the record woken within it, and the mark carries the
// sequences (this process's report reads them from memory), which saves the
// write.
const sequencesDelay = 2 * time.Second

// pendingSequences are sequence writes waiting for sequencesDelay.
type pendingSequences struct {
	mu      sync.Mutex
	pending map[string]*pendingWrite
	closed  bool
}

type pendingWrite struct {
	rec   *protocol.CallRecord
	rev   uint64
	timer *time.Timer
}

// deferSequences stores rec's card and command sequences in its record
// (at revision rev) after sequencesDelay, unless a mark of the record that
// carries them lands first.
func (l *Ledger) deferSequences(key string, rec *protocol.CallRecord, rev uint64) {
	p := &pendingWrite{rec: cloneRecord(rec), rev: rev}
	l.bg.start()
	ps := &l.seqs
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		l.writeSequences(key, p)
		return
	}
	if ps.pending == nil {
		ps.pending = map[string]*pendingWrite{}
	}
	if old := ps.pending[key]; old != nil && old.timer.Stop() {
		// A repeated dispatch of the call: its write stands for both.
		l.bg.done()
	}
	ps.pending[key] = p
	p.timer = time.AfterFunc(sequencesDelay, func() { l.dueSequences(key, p) })
	ps.mu.Unlock()
}

// dueSequences runs a deferred write whose time has come.
func (l *Ledger) dueSequences(key string, p *pendingWrite) {
	ps := &l.seqs
	ps.mu.Lock()
	if ps.pending[key] == p {
		delete(ps.pending, key)
	}
	ps.mu.Unlock()
	l.writeSequences(key, p)
}

// writeSequences writes the sequences unless this process has since seen the
// record at a later revision that has them.
func (l *Ledger) writeSequences(key string, p *pendingWrite) {
	defer l.bg.done()
	if c, ok := l.cache.records.get(key); ok && c.rev > p.rev && c.rec.CommandSeq != 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.recordSequences(ctx, key, p.rec, p.rev); err != nil {
		l.log.Warn("dispatch: record the command's sequence", "key", key, "err", err)
	}
}

// flushSequences runs every deferred write now; closing makes later ones run
// at once.
func (l *Ledger) flushSequences(closing bool) {
	ps := &l.seqs
	ps.mu.Lock()
	ps.closed = ps.closed || closing
	due := ps.pending
	ps.pending = nil
	ps.mu.Unlock()
	for key, p := range due {
		if p.timer.Stop() {
			l.writeSequences(key, p)
		}
	}
}
