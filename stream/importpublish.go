package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// importChunk verified entries go to the publisher at a time, and at most
// importQueue chunks wait for it: the read runs at most that far ahead of
// the publishes (which run at most InFlight ahead of their acks), so that
// a pause of the server's does not stop the read (nor a replay's views).
const (
	importChunk = 256
	importQueue = 32
)

// importItem is one verified entry to publish: the sequence it must get.
type importItem struct {
	seq uint64
	msg *nats.Msg
}

// errPublisherStopped tells the reader that the publisher failed; its own
// error (importPublisher.wait) is the one returned.
var errPublisherStopped = errors.New("import: publisher stopped")

// importPublisher publishes the verified entries of an import on a
// goroutine of its own, in order, each with the sequence it must get,
// pipelined (at most inFlight awaiting their ack).
type importPublisher struct {
	ctx    context.Context
	chunks chan []importItem
	// stopped is closed when the publisher fails: the reader stops.
	stopped chan struct{}
	done    chan struct{}
	err     error
}

// startImportPublisher starts the publisher of an import into stream.
// progress (nil for none) is called after each publish with the count.
func startImportPublisher(ctx context.Context, js jetstream.JetStream, stream string, inFlight int, progress func(uint64)) *importPublisher {
	p := &importPublisher{ctx: ctx, chunks: make(chan []importItem, importQueue), stopped: make(chan struct{}), done: make(chan struct{})}
	go p.run(js, inFlight, progress)
	return p
}

func (p *importPublisher) run(js jetstream.JetStream, inFlight int, progress func(uint64)) {
	defer close(p.done)
	type pending struct {
		seq uint64
		ack jetstream.PubAckFuture
	}
	var window []pending
	// settle waits for the oldest publishes until at most keep remain.
	settle := func(keep int) error {
		for len(window) > keep {
			w := window[0]
			select {
			case ack := <-w.ack.Ok():
				if ack.Sequence != w.seq {
					return fmt.Errorf("import: entry %d was stored as %d", w.seq, ack.Sequence)
				}
			case err := <-w.ack.Err():
				return fmt.Errorf("import: entry %d: %w", w.seq, err)
			case <-p.ctx.Done():
				return fmt.Errorf("import: %w", p.ctx.Err())
			}
			window = window[1:]
		}
		return nil
	}
	var published uint64
	publish := func(c []importItem) error {
		for _, it := range c {
			ack, err := js.PublishMsgAsync(it.msg)
			if err != nil {
				return fmt.Errorf("import: entry %d: %w", it.seq, err)
			}
			window = append(window, pending{seq: it.seq, ack: ack})
			if err := settle(inFlight - 1); err != nil {
				return err
			}
			published++
			if progress != nil {
				progress(published)
			}
		}
		return nil
	}
	for c := range p.chunks {
		if p.err != nil {
			continue
		}
		if p.err = publish(c); p.err != nil {
			close(p.stopped)
		}
	}
	if p.err == nil {
		p.err = settle(0)
	}
}

// send hands a chunk to the publisher; it returns errPublisherStopped once
// the publisher has failed, and the context's error when it ends.
func (p *importPublisher) send(c []importItem) error {
	select {
	case p.chunks <- c:
		return nil
	case <-p.stopped:
		return errPublisherStopped
	case <-p.ctx.Done():
		return fmt.Errorf("import: %w", p.ctx.Err())
	}
}

// close tells the publisher no more chunks come.
func (p *importPublisher) close() { close(p.chunks) }

// wait waits for the publisher to publish what it was sent and every ack,
// and returns what stopped it, if anything.
func (p *importPublisher) wait() error {
	<-p.done
	return p.err
}

// importMsgOwned is importMsg for an entry whose headers the import owns
// (as ReadExport hands them over): the map is reused for the message,
// without JetStream's own Nats-* headers, and given the two that make
// JetStream refuse the entry (and so every later one) unless it gets its
// own sequence in stream: what WithExpectStream and WithExpectLastSequence
// set, without the copy a second map would take.
func importMsgOwned(e ExportEntry, stream string) *nats.Msg {
	h := nats.Header(e.Headers)
	if h == nil {
		h = make(nats.Header, 2)
	}
	for k := range h {
		if isNatsHeader(k) {
			delete(h, k)
		}
	}
	h[jetstream.ExpectedStreamHeader] = []string{stream}
	h[jetstream.ExpectedLastSeqHeader] = []string{strconv.FormatUint(e.Seq-1, 10)}
	return &nats.Msg{Subject: e.Subject, Data: e.Data, Header: h}
}

// isNatsHeader reports whether name is one of JetStream's own Nats-*
// headers, in any case (without lower-casing a copy of every name).
func isNatsHeader(name string) bool {
	return len(name) >= 5 && strings.EqualFold(name[:5], "nats-")
}
