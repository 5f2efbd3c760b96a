package ledger

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// maxKeeperAcks bounds the commands the deadline keeper remembers to
// acknowledge early. Past it a command waits for its deadline as every
// command did before (issue 30): the bound costs speed, never a deadline.
const maxKeeperAcks = 1 << 18

// keeperAcks lets the deadline keeper acknowledge a command as soon as this
// process has stored its call's report and wakeup, instead of at the
// deadline. A command handed back until its deadline stays pending in the
// keeper's consumer, and nats-server walks and persists a consumer's whole
// pending set: with every call of the last timeout window pending (30 s of
// calls by default), that work grew with the call rate and made a run
// slower the longer it went (docs/performance.md). Acknowledged at its
// report, a call is pending for its run only.
//
// The keeper registers a command after it hands the command back (so the
// acknowledgement follows the hand-back on the same connection); the report
// path marks the call done after it remembers the woken record. Each side
// looks for the other under mu, and the keeper also reads the record cache
// after registering, so one of them acknowledges whichever comes first.
// A command this process never sees reported (another process reported it,
// or this one was restarted) is acknowledged at its deadline as before.
type keeperAcks struct {
	nc *nats.Conn
	mu sync.Mutex
	// waiting holds, per call key, the reply subject of the command's
	// delivery to this process's keeper and when it is due.
	waiting map[string]keeperAck
}

type keeperAck struct {
	reply string
	due   time.Time
}

func newKeeperAcks(nc *nats.Conn) *keeperAcks {
	return &keeperAcks{nc: nc, waiting: make(map[string]keeperAck)}
}

// register remembers the delivery of key's command, handed back until due.
// It reports false when there is no room: the command waits for its due
// delivery.
func (a *keeperAcks) register(key, reply string, due time.Time) bool {
	if reply == "" {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.waiting) >= maxKeeperAcks {
		a.dropPastLocked(time.Now())
		if len(a.waiting) >= maxKeeperAcks {
			return false
		}
	}
	a.waiting[key] = keeperAck{reply: reply, due: due}
	return true
}

// dropPastLocked forgets commands whose due delivery has come: it went to
// whichever process pulled it, which acknowledged it or timed the call out.
func (a *keeperAcks) dropPastLocked(now time.Time) {
	for k, w := range a.waiting {
		if now.After(w.due) {
			delete(a.waiting, k)
		}
	}
}

// forget drops key's registration: its due delivery has come to this
// keeper, which decides it.
func (a *keeperAcks) forget(key string) {
	a.mu.Lock()
	delete(a.waiting, key)
	a.mu.Unlock()
}

// done acknowledges key's command if this process's keeper holds it: the
// call's report and wakeup are stored, so its deadline keeps nothing.
func (a *keeperAcks) done(key string) {
	a.mu.Lock()
	w, ok := a.waiting[key]
	if ok {
		delete(a.waiting, key)
	}
	a.mu.Unlock()
	if ok {
		a.ack(w.reply)
	}
}

// ack acknowledges a delivery by its reply subject. The delivery was
// handed back (a NAK with a delay), after which nats.go's Msg refuses to
// acknowledge it; the server takes an ACK of a pending message from any of
// its deliveries' reply subjects. A lost ACK only leaves the command to its
// due delivery.
func (a *keeperAcks) ack(reply string) {
	_ = a.nc.Publish(reply, []byte("+ACK"))
}
