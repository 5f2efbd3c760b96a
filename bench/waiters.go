package bench

import "sync"

// waiters are the calls waiting for their wakeup (or answer), by call id.
// A call registers before it sends anything, since the wakeup can come
// before the send returns.
type waiters struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// expect registers id and returns the channel its wakeup closes.
func (w *waiters) expect(id string) chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	if w.m == nil {
		w.m = make(map[string]chan struct{})
	}
	w.m[id] = ch
	w.mu.Unlock()
	return ch
}

// forget drops id, woken or not.
func (w *waiters) forget(id string) {
	w.mu.Lock()
	delete(w.m, id)
	w.mu.Unlock()
}

// wake closes id's channel, if it still waits.
func (w *waiters) wake(id string) {
	w.mu.Lock()
	ch := w.m[id]
	delete(w.m, id)
	w.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}
