package projector

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"
)

// shrinkDigestWalk makes every file of the largest level a span of its
// own, with queues of two small buffers, so a small store takes many
// spans, full queues and rows larger than a buffer.
func shrinkDigestWalk(t *testing.T) {
	spanBytes, rowBuf, queue := digestSpanBytes, digestRowBuf, digestSpanQueue
	digestSpanBytes, digestRowBuf, digestSpanQueue = 1, 4096, 2
	t.Cleanup(func() { digestSpanBytes, digestRowBuf, digestSpanQueue = spanBytes, rowBuf, queue })
}

// fillLevels writes rows across every part of an LSM: compacted into the
// bottom level in many small files, flushed into L0 over them, and still
// in the memtable; among them empty values and values larger than a
// buffer.
func fillLevels(t *testing.T, s *Store) {
	rnd := rand.New(rand.NewPCG(3, 4))
	write := func(n int) {
		b := s.db.NewBatch()
		for range n {
			k := fmt.Appendf(nil, "test/%08d", rnd.IntN(200000))
			size := rnd.IntN(600)
			switch rnd.IntN(200) {
			case 0:
				size = 0
			case 1:
				size = 3*digestRowBuf + rnd.IntN(9000)
			}
			v := make([]byte, size)
			for i := range v {
				v[i] = byte(rnd.Uint32())
			}
			require.NoError(t, b.Set(k, v, nil))
		}
		require.NoError(t, b.Commit(pebble.NoSync))
	}
	for range 6 {
		write(3000)
		require.NoError(t, s.db.Flush())
	}
	require.NoError(t, s.db.Compact(t.Context(), []byte("a"), []byte("z"), false))
	write(2000)
	require.NoError(t, s.db.Flush())
	write(500)
}

// sequentialDigest is the digest as docs/views.md defines it, computed the
// plain way: one iterator, one SHA-256.
func sequentialDigest(t *testing.T, s *Store) string {
	h := sha256.New()
	var n [8]byte
	require.NoError(t, s.Dump(func(k, v []byte) error {
		binary.BigEndian.PutUint64(n[:], uint64(len(k)))
		h.Write(n[:])
		h.Write(k)
		binary.BigEndian.PutUint64(n[:], uint64(len(v)))
		h.Write(n[:])
		h.Write(v)
		return nil
	}))
	return hex.EncodeToString(h.Sum(nil))
}

// The walk in spans must hash exactly the rows, in the order, that one
// iterator yields, whatever the cuts: many spans with full queues, and the
// default cuts (one span on a store this small).
func TestDigestWalkInSpansEqualsOneSequentialHash(t *testing.T) {
	s, err := OpenStore(filepath.Join(t.TempDir(), "views"), StoreOptions{})
	require.NoError(t, err)
	defer s.Close()
	fillLevels(t, s)
	want := sequentialDigest(t, s)

	d, err := s.Digest()
	require.NoError(t, err)
	require.Equal(t, want, d, "default cuts")

	shrinkDigestWalk(t)
	sp, err := s.spans()
	require.NoError(t, err)
	require.Greater(t, len(sp), 5, "the bottom level's files cut the range into spans")
	for i := 1; i < len(sp); i++ {
		require.Equal(t, sp[i-1].hi, sp[i].lo, "spans meet")
		require.Less(t, string(sp[i].lo), string(sp[i].hi)+"\xff", "spans advance")
	}
	require.Nil(t, sp[0].lo)
	require.Nil(t, sp[len(sp)-1].hi)
	for range 3 {
		d, err := s.Digest()
		require.NoError(t, err)
		require.Equal(t, want, d, "many spans, full queues")
	}
}

// A read that fails in any span fails the digest with the read's error,
// and every walker ends.
func TestDigestWalkFailsOnAReadErrorAndStops(t *testing.T) {
	dir := closedFilledStore(t)

	broken := errors.New("read: input/output error")
	var reads atomic.Int64
	fail := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		// Fail a read well inside the walk, not the first one.
		if op.Kind == errorfs.OpFileReadAt && strings.HasSuffix(op.Path, ".sst") {
			if reads.Add(1) > 40 {
				return broken
			}
		}
		return nil
	})}
	s, err := OpenStore(dir, StoreOptions{FS: errorfs.Wrap(vfs.Default, fail)})
	require.NoError(t, err)
	defer s.Close()
	fail.On()
	_, err = s.DigestNow()
	fail.Off()
	require.ErrorIs(t, err, broken)
	require.Contains(t, err.Error(), "projector: digest")
	stacks := make([]byte, 1<<20)
	stacks = stacks[:runtime.Stack(stacks, true)]
	require.NotContains(t, string(stacks), "walkSpan", "every walker has ended when the digest returns")
	want := sequentialDigest(t, s)
	d, err := s.Digest()
	require.NoError(t, err)
	require.Equal(t, want, d, "once reads work, the same store digests as before")
}

// closedFilledStore is the directory of a closed store filled by
// fillLevels and flushed, with the digest walk shrunk for the test.
func closedFilledStore(t *testing.T) string {
	t.Helper()
	shrinkDigestWalk(t)
	dir := filepath.Join(t.TempDir(), "views")
	s, err := OpenStore(dir, StoreOptions{})
	require.NoError(t, err)
	fillLevels(t, s)
	require.NoError(t, s.db.Flush())
	require.NoError(t, s.Close())
	return dir
}

// flipInLargestSST flips one byte in the middle of the largest sstable of
// the (closed) store in dir: inside a data block, so its checksum fails.
func flipInLargestSST(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var big string
	var bigSize int64
	for _, e := range ents {
		info, err := e.Info()
		require.NoError(t, err)
		if strings.HasSuffix(e.Name(), ".sst") && info.Size() > bigSize {
			big, bigSize = filepath.Join(dir, e.Name()), info.Size()
		}
	}
	require.NotEmpty(t, big)
	f, err := os.OpenFile(big, os.O_RDWR, 0)
	require.NoError(t, err)
	b := []byte{0}
	_, err = f.ReadAt(b, bigSize/3)
	require.NoError(t, err)
	b[0] ^= 0x20
	_, err = f.WriteAt(b, bigSize/3)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// A corrupt block is an error of the read that finds it, not the end of
// the process (Pebble's default for corruption is a fatal log): the digest
// of a checkpoint with one fails, and an open store tells Corruption.
func TestCorruptionFailsTheDigestAndDoesNotPanic(t *testing.T) {
	dir := closedFilledStore(t)
	flipInLargestSST(t, dir)

	cp, err := OpenCheckpoint(dir)
	require.NoError(t, err)
	_, err = cp.DigestNow()
	require.ErrorContains(t, err, "checksum mismatch")
	require.True(t, pebble.IsCorruptionError(err), "%v", err)
	require.NotContains(t, err.Error(), "\n", "one line, without Pebble's detail carrier")
	require.NoError(t, cp.Close())

	var told atomic.Int64
	s, err := OpenStore(dir, StoreOptions{Corruption: func(err error) {
		if pebble.IsCorruptionError(err) {
			told.Add(1)
		}
	}})
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Digest()
	require.ErrorContains(t, err, "checksum mismatch")
	require.Positive(t, told.Load(), "Corruption hears of it")
}

// A compaction that meets a corrupt block fails each time Pebble retries
// it, at once and without end: the views' listener slows each retry (a few
// a second, not a core's worth) and does not report it as a failed write,
// which Corruption covers; other failed writes are still reported.
func TestBackgroundErrorOnACorruptFileIsSlowedAndNotAFailedWrite(t *testing.T) {
	var failedWrites atomic.Int64
	opts := dbOptions(StoreOptions{BackgroundError: func(error) { failedWrites.Add(1) }}, nil, viewsComparer, new(atomic.Bool))
	corrupt := fmt.Errorf("compaction: block 3/12: checksum mismatch: %w", pebble.ErrCorruption)
	start := time.Now()
	opts.EventListener.BackgroundError(corrupt)
	require.GreaterOrEqual(t, time.Since(start), backgroundRetryPause, "the retry is slowed")
	require.Zero(t, failedWrites.Load(), "corruption is not a failed write")
	opts.EventListener.BackgroundError(errors.New("write 000012.sst: input/output error"))
	require.Equal(t, int64(1), failedWrites.Load())
}
