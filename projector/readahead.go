package projector

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/protocol"
)

// catchUpPull is how many entries a catch-up asks the stream for at a time:
// it knows they are there, and fewer, larger pulls cost the server and the
// client less per entry.
const catchUpPull = 4096

// readAheadChunk entries travel from the reading goroutine to the applying
// one at a time, and at most readAheadChunks chunks wait: the read runs
// that far ahead of the views (beside what the client holds).
const (
	readAheadChunk  = 256
	readAheadChunks = 8
)

// fetched is an entry read from the stream and how many followed it there.
type fetched struct {
	e          protocol.Entry
	numPending uint64
}

// readAhead reads a catch-up's entries on its own goroutine, so that the
// client's delivery and each entry's metadata are handled on one core
// while the projector applies on the other.
type readAhead struct {
	chunks chan []fetched
	// err is what ended the read, set before chunks is closed.
	err    error
	cur    []fetched
	cancel context.CancelFunc
	done   chan struct{}
}

// startReadAhead reads from it until the entry at sequence until (or one
// after it), an entry with none after it in the stream, an error, or
// ctx's end.
func startReadAhead(ctx context.Context, it jetstream.MessagesContext, until uint64) *readAhead {
	ctx, cancel := context.WithCancel(ctx)
	r := &readAhead{chunks: make(chan []fetched, readAheadChunks), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer close(r.chunks)
		chunk := make([]fetched, 0, readAheadChunk)
		for {
			m, err := it.Next(jetstream.NextContext(ctx))
			if err == nil {
				var meta *jetstream.MsgMetadata
				if meta, err = m.Metadata(); err != nil {
					err = fmt.Errorf("entry metadata: %w", err)
				} else {
					chunk = append(chunk, fetched{
						e:          protocol.Entry{Seq: meta.Sequence.Stream, Subject: m.Subject(), Headers: m.Headers(), Data: m.Data(), Time: meta.Timestamp},
						numPending: meta.NumPending,
					})
					// The last entry the catch-up needs, or the last the
					// stream has, goes at once: nothing may follow soon.
					last := meta.Sequence.Stream >= until || meta.NumPending == 0
					if len(chunk) < readAheadChunk && !last {
						continue
					}
					select {
					case r.chunks <- chunk:
					case <-ctx.Done():
						r.err = ctx.Err()
						return
					}
					if meta.Sequence.Stream >= until {
						return
					}
					chunk = make([]fetched, 0, readAheadChunk)
					continue
				}
			}
			if len(chunk) > 0 {
				select {
				case r.chunks <- chunk:
				case <-ctx.Done():
				}
			}
			r.err = err
			return
		}
	}()
	return r
}

// next returns the next entry read, or what ended the read.
func (r *readAhead) next() (fetched, error) {
	for len(r.cur) == 0 {
		c, ok := <-r.chunks
		if !ok {
			if r.err == nil {
				// The read stops only after the last entry needed, which
				// ends the catch-up before it asks for another.
				return fetched{}, fmt.Errorf("read ahead ended")
			}
			return fetched{}, r.err
		}
		r.cur = c
	}
	f := r.cur[0]
	r.cur = r.cur[1:]
	return f, nil
}

// stop ends the read and waits for its goroutine.
func (r *readAhead) stop() {
	r.cancel()
	for range r.chunks {
	}
	<-r.done
}
