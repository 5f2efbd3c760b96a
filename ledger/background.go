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

// Flush waits for the reports this ledger has in flight. The report path
// writes nothing after its answer (the wakeup is the mark, issue 30), so
// reads never need it; it stays for callers written when they did.
func (l *Ledger) Flush() {
	l.bg.wait()
}
