package projector

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
)

// The digest is one SHA-256 over every row in key order, so the hash
// cannot be split; but the walk that produces the rows (reading and
// decompressing blocks, stepping the iterator) costs about three times the
// hash (a 200k-call profile: 3.2 s of CPU against 0.9 s).
// So the key range is cut into spans that walkers serialise at once, each
// span into its own bounded queue, and one goroutine hashes the queues in
// key order. A walker ahead of the span being hashed serialises at most
// digestSpanQueue buffers of it, then waits: the span being hashed never
// waits on another's buffers, so the walk cannot deadlock, and what is in
// flight stays under digestWalkers x digestSpanQueue x digestRowBuf.
//
// Variables, not constants: the tests shrink them to force many spans and
// full queues on a small store.
var (
	// digestSpanBytes is the stored (compressed) size a span aims at:
	// small enough that a walker ahead can serialise most of a span into
	// its queue (rows take about 3.5x their stored size), large enough that
	// seeking into a span costs nothing next to walking it.
	digestSpanBytes uint64 = 6 << 20
	// digestRowBuf is the size of the buffers rows are serialised into.
	digestRowBuf = 128 << 10
	// digestSpanQueue is how many buffers of one span may wait unhashed.
	digestSpanQueue = (32 << 20) / (128 << 10)
	// digestMaxWalkers bounds the walkers: with the hash about three times
	// as fast as one walker, three walkers are the most it can keep up with.
	digestMaxWalkers = 3
)

// span is one key range [lo, hi) of the walk (nil: unbounded) and the
// queue its walker fills.
type span struct {
	lo, hi []byte
	out    chan []byte
	// err is what ended the span's walk early, set before out is closed.
	err error
}

// spans cuts the key range at the smallest keys of files of the level that
// holds the most bytes (a level's files are disjoint and in key order), so
// that each span holds about digestSpanBytes of that level. The cuts need
// not be exact: each span is walked on the same snapshot, so any cuts give
// the same rows in the same order.
func (s *Store) spans() ([]*span, error) {
	levels, err := s.db.SSTables()
	if err != nil {
		return nil, fmt.Errorf("projector: digest: list sstables: %w", err)
	}
	best, bestBytes := -1, uint64(0)
	for i, l := range levels {
		var n uint64
		for _, t := range l {
			n += t.Size
		}
		if n > bestBytes {
			best, bestBytes = i, n
		}
	}
	out := []*span{{}}
	if best < 0 {
		return out, nil
	}
	var acc uint64
	for _, t := range levels[best] {
		last := out[len(out)-1]
		if acc >= digestSpanBytes && bytes.Compare(t.Smallest.UserKey, last.lo) > 0 {
			k := bytes.Clone(t.Smallest.UserKey)
			last.hi = k
			out = append(out, &span{lo: k})
			acc = 0
		}
		acc += t.Size
	}
	return out, nil
}

// hashRows writes every row of snap, in key order, into one SHA-256 (the
// row encoding of Digest) and returns its sum.
func (s *Store) hashRows(snap *pebble.Snapshot) ([]byte, error) {
	spans, err := s.spans()
	if err != nil {
		return nil, err
	}
	for _, sp := range spans {
		sp.out = make(chan []byte, digestSpanQueue)
	}
	walkers := min(runtime.GOMAXPROCS(0), digestMaxWalkers, len(spans))
	// Hashed buffers go back to the walkers; at most every buffer in
	// flight is ever kept, so the pool adds nothing to that bound.
	free := make(chan []byte, walkers*(digestSpanQueue+1))
	bufs := func() []byte {
		select {
		case b := <-free:
			return b[:0]
		default:
			return make([]byte, 0, digestRowBuf)
		}
	}
	done := make(chan struct{})
	var next atomic.Int64
	var wg sync.WaitGroup
	for range walkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(spans) {
					return
				}
				sp := spans[i]
				sp.err = walkSpan(snap, sp, bufs, done)
				close(sp.out)
				if sp.err != nil {
					return
				}
			}
		}()
	}
	h := sha256.New()
	for _, sp := range spans {
		for b := range sp.out {
			h.Write(b)
			select {
			case free <- b:
			default:
			}
		}
		if err = sp.err; err != nil {
			break
		}
	}
	// On an error the walkers still running stop at their next send.
	close(done)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// walkSpan serialises the rows of sp into buffers from bufs, sent on
// sp.out; it stops early, without error, once done is closed.
func walkSpan(snap *pebble.Snapshot, sp *span, bufs func() []byte, done <-chan struct{}) (err error) {
	// Pebble's fatal log panics (quietLogger); on a walker's goroutine
	// nothing above would recover it, so it becomes the walk's error.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("projector: digest: %w", asStoreFatal(r))
		}
	}()
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: sp.lo, UpperBound: sp.hi})
	if err != nil {
		return fmt.Errorf("projector: digest: %w", err)
	}
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("projector: digest: %w", cerr)
		}
	}()
	buf := bufs()
	send := func() bool {
		select {
		case sp.out <- buf:
			buf = bufs()
			return true
		case <-done:
			return false
		}
	}
	for ok := it.First(); ok; ok = it.Next() {
		k, v := it.Key(), it.Value()
		if len(buf) > 0 && len(buf)+16+len(k)+len(v) > cap(buf) && !send() {
			return nil
		}
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(k)))
		buf = append(buf, k...)
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(v)))
		buf = append(buf, v...)
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("projector: digest: %w", oneLine(err))
	}
	if len(buf) > 0 {
		send()
	}
	return nil
}
