package ledger

import "sync"

// background counts work the ledger finishes after answering (marking a
// reported call woken). Unlike a sync.WaitGroup it may be waited on while
// new work starts.
type background struct {
	mu   sync.Mutex
	cond *sync.Cond
	n    int
}

func (b *background) start() {
	b.mu.Lock()
	b.n++
	b.mu.Unlock()
}

func (b *background) done() {
	b.mu.Lock()
	b.n--
	if b.n == 0 && b.cond != nil {
		b.cond.Broadcast()
	}
	b.mu.Unlock()
}

// wait returns once no work is running.
func (b *background) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cond == nil {
		b.cond = sync.NewCond(&b.mu)
	}
	for b.n > 0 {
		b.cond.Wait()
	}
}

// Flush does now, and waits for, the work this ledger finishes after
// answering: every call it dispatched has its sequences in the call-record
// bucket and every call whose report it accepted is marked woken (or the
// write has failed and been logged; the next report or redelivery of the
// call finishes it). Reads of the stream never need it.
func (l *Ledger) Flush() {
	l.flushSequences(false)
	l.bg.wait()
}
