package archive

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cgledger/cgledger/internal/backoff"
	"github.com/cgledger/cgledger/internal/fsyncdir"
	"github.com/cgledger/cgledger/stream"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cgledger/cgledger/protocol"
)

// Config configures an Archiver. Zero values mean the documented defaults.
type Config struct {
	// Streams names the ledger stream and bucket (as ledger.Config.Streams
	// does); the retention window is applied to both.
	Streams stream.Config
	// Retention is the window: the TTL the ledger gives entries
	// (ledger.Config.Retention, which must be the same), and the bucket's
	// TTL, applied once the archive has caught up with the stream. Zero
	// keeps call records forever.
	Retention time.Duration
	// SealAge seals the open segment once its first entry is this old.
	// Zero means a tenth of Retention, at most one hour (one hour when
	// Retention is zero). It must stay well inside Retention: an entry is
	// safe from expiry only once its segment is sealed.
	SealAge time.Duration
	// SegmentBytes seals the open segment once it is this large. Zero means
	// 64 MiB.
	SegmentBytes int64
	// LinkAt, when set, gives the chain link after a sequence as the views
	// recorded it. After lost history it lets the next segment's header
	// carry the true link, so the chain still verifies past the loss.
	LinkAt func(seq uint64) (protocol.Link, bool, error)
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer, if set, receives the archive's metrics.
	Registerer prometheus.Registerer
}

// DefaultSegmentBytes is Config.SegmentBytes's default.
const DefaultSegmentBytes = 64 << 20

func (c Config) withDefaults() Config {
	if c.Streams.Stream == "" {
		c.Streams.Stream = stream.DefaultName
	}
	if c.SealAge <= 0 {
		c.SealAge = time.Hour
		if c.Retention > 0 {
			c.SealAge = min(c.Retention/10, time.Hour)
		}
	}
	if c.SegmentBytes <= 0 {
		c.SegmentBytes = DefaultSegmentBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Archiver copies every entry of the ledger stream, in order, into sealed
// segments of an Archive before the entries' TTL lets them go, and applies
// the bucket's TTL once the archive has caught up. Run it in the one process that owns the archive
// directory (serve holds the data directory's lock).
type Archiver struct {
	arch *Archive
	js   jetstream.JetStream
	cfg  Config
	log  *slog.Logger

	firstPass     chan struct{}
	firstPassOnce sync.Once

	sealed    atomic.Uint64
	lost      atomic.Uint64
	applied   atomic.Bool
	sealedSeq prometheus.GaugeFunc
	segments  prometheus.Counter
	lostTotal prometheus.Counter
}

// New returns an Archiver writing into arch. A configuration Validate
// refuses is refused with its every problem.
func New(arch *Archive, js jetstream.JetStream, cfg Config) (*Archiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	cfg = cfg.withDefaults()
	a := &Archiver{arch: arch, js: js, cfg: cfg, log: cfg.Logger, firstPass: make(chan struct{})}
	last, _, err := arch.Last()
	if err != nil {
		return nil, err
	}
	a.sealed.Store(last)
	lost, err := arch.Lost()
	if err != nil {
		return nil, err
	}
	for _, r := range lost {
		a.lost.Add(r[1] - r[0] + 1)
	}
	a.sealedSeq = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cgledger_archive_sealed_seq",
		Help: "Last ledger sequence held in a sealed archive segment (docs/durability.md); the stream may expire entries up to it.",
	}, func() float64 { return float64(a.sealed.Load()) })
	a.segments = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cgledger_archive_segments_sealed_total",
		Help: "Archive segments sealed by this process.",
	})
	a.lostTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cgledger_archive_lost_entries_total",
		Help: "Ledger entries that expired from the stream before they were archived (serve down longer than the retention window); any increase is lost history.",
	})
	a.lostTotal.Add(float64(a.lost.Load()))
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{a.sealedSeq, a.segments, a.lostTotal} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("archive: register metrics: %w", err)
			}
		}
	}
	return a, nil
}

// Sealed is the last sequence held in a sealed segment.
func (a *Archiver) Sealed() uint64 { return a.sealed.Load() }

// Lost is the number of entries recorded as lost.
func (a *Archiver) Lost() uint64 { return a.lost.Load() }

// RetentionApplied reports whether the archive has caught up with the
// stream at least once, and the bucket's TTL has been applied.
func (a *Archiver) RetentionApplied() bool { return a.applied.Load() }

// FirstPass is closed once the archiver has read the stream once (or
// failed to): by then it has recorded any entries that expired while it was
// not running, so a projector started after it finds their marker instead
// of an unexplained gap.
func (a *Archiver) FirstPass() <-chan struct{} { return a.firstPass }

// Run archives until ctx ends, retrying from the last sealed segment after
// a failure. At the end it seals what it holds, so a restart does not
// depend on the stream keeping it.
func (a *Archiver) Run(ctx context.Context) error {
	defer a.firstPassOnce.Do(func() { close(a.firstPass) })
	wait := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		err := a.follow(ctx)
		a.firstPassOnce.Do(func() { close(a.firstPass) })
		if ctx.Err() != nil {
			return nil
		}
		a.log.Warn("archive: following the stream failed; retrying from the last sealed segment", "err", err, "sealed_seq", a.Sealed())
		if wait.Wait(ctx) != nil {
			return nil
		}
	}
}

// follow archives from after the last sealed segment on. It reads the
// stream in bursts, once per poll, rather than following every entry as
// it is written: a live reader costs the server a delivery per entry on
// the writes' hot path, a burst costs one consumer and bulk pulls.
func (a *Archiver) follow(ctx context.Context) error {
	last, head, err := a.arch.Last()
	if err != nil {
		return err
	}
	s, err := a.js.Stream(ctx, a.cfg.Streams.Stream)
	if err != nil {
		return fmt.Errorf("archive: stream %s: %w", a.cfg.Streams.Stream, err)
	}
	w := &segmentWriter{arch: a.arch, stream: a.cfg.Streams.Stream, next: last + 1, head: head}
	defer w.abandon()
	// A loss recorded before (at the end of the archive) is not recorded
	// again: the archive goes on after it.
	for {
		lr, ok, err := a.arch.LostAt(w.next)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		w.next, w.head = lr.Last+1, lr.Next
	}
	tick := time.NewTicker(a.pollEvery())
	defer tick.Stop()
	for {
		err := a.drain(ctx, s, w)
		a.firstPassOnce.Do(func() { close(a.firstPass) })
		if err == nil && w.open() && time.Since(w.firstTime) >= a.sealAge(w) {
			err = a.seal(w)
		}
		if ctx.Err() != nil {
			if err := a.seal(w); err != nil {
				a.log.Error("archive: seal at shutdown", "err", err)
			}
			return ctx.Err()
		}
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// sealAge is how old the open segment's first entry may get before the
// segment is sealed: SealAge, or a tenth of the shortest TTL an entry in
// it carries when that is sooner. The window of entries written under
// another setting (a retention since shortened or removed) is in their
// Nats-TTL header, and an entry is safe from expiry only once sealed.
func (a *Archiver) sealAge(w *segmentWriter) time.Duration {
	if w.minTTL <= 0 {
		return a.cfg.SealAge
	}
	return min(a.cfg.SealAge, max(w.minTTL/10, minSealAge))
}

// minSealAge is the shortest seal age the archiver uses.
const minSealAge = 100 * time.Millisecond

// entryTTL is the TTL an entry was written with (its Nats-TTL header: a Go
// duration or whole seconds), or 0 for none or "never".
func entryTTL(h map[string][]string) time.Duration {
	v := nats.Header(h).Get(jetstream.MsgTTLHeader)
	if v == "" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 0
}

// pollEvery is how often the archiver reads what was written since its
// last read: well inside the seal age, at most a second.
func (a *Archiver) pollEvery() time.Duration {
	return max(min(a.cfg.SealAge/4, time.Second), 10*time.Millisecond)
}

// drain reads every entry written since w.next into the open segment.
func (a *Archiver) drain(ctx context.Context, s jetstream.Stream, w *segmentWriter) error {
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("archive: stream info: %w", err)
	}
	if info.State.LastSeq < w.next {
		return a.caughtUp(ctx, w)
	}
	// A short inactivity threshold and an explicit delete keep one
	// consumer per burst from piling up.
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: w.next, InactiveThreshold: 10 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("archive: consumer: %w", err)
	}
	defer func() {
		if ci := cons.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = s.DeleteConsumer(dctx, ci.Name)
			cancel()
		}
	}()
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		// Nothing from w.next on is left to deliver: what the stream
		// assigned past the archive expired while no one archived it.
		if err := a.checkTail(ctx, s, w); err != nil {
			return err
		}
		return a.caughtUp(ctx, w)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return fmt.Errorf("archive: messages: %w", err)
	}
	defer it.Stop()
	for {
		nctx, cancel := context.WithTimeout(ctx, stallCheck)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				// Nothing arrives though entries were pending: they may have
				// expired meanwhile. The next poll reads on either way.
				return a.checkTail(ctx, s, w)
			}
			return fmt.Errorf("archive: next entry: %w", err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("archive: entry metadata: %w", err)
		}
		e := protocol.Entry{Seq: meta.Sequence.Stream, Subject: m.Subject(), Headers: m.Headers(), Data: m.Data(), Time: meta.Timestamp.UTC()}
		if e.Seq < w.next {
			continue // redelivered after an ordered consumer reset
		}
		if e.Seq > w.next {
			if err := a.recordLost(w, w.next, e.Seq-1); err != nil {
				return err
			}
		}
		if err := w.add(e); err != nil {
			return err
		}
		if w.size >= a.cfg.SegmentBytes {
			if err := a.seal(w); err != nil {
				return err
			}
		}
		if meta.NumPending == 0 {
			// Entries after this one are newer: none can have expired
			// unless this one is near the end of the window itself. With
			// no window of its own the archiver does not know the TTLs
			// of what follows, so it always looks.
			if a.cfg.Retention == 0 || time.Since(e.Time) >= a.cfg.Retention/2 {
				if err := a.checkTail(ctx, s, w); err != nil {
					return err
				}
			}
			return a.caughtUp(ctx, w)
		}
	}
}

// stallCheck is how long a burst waits for a pending entry before it
// checks whether the entry still exists.
const stallCheck = 2 * time.Second

// checkTail is called when no entry from w.next on is pending: if the
// stream's last sequence is past w.next and gone too, everything from
// w.next to it expired unarchived. (Had anything been written since,
// the last sequence would exist, and its delivery shows the jump.)
func (a *Archiver) checkTail(ctx context.Context, s jetstream.Stream, w *segmentWriter) error {
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("archive: stream info: %w", err)
	}
	last := info.State.LastSeq
	if last < w.next {
		return nil
	}
	if _, err := s.GetMsg(ctx, last); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("archive: read seq %d: %w", last, err)
	}
	return a.recordLost(w, w.next, last)
}

// caughtUp seals what is open and then applies the bucket's TTL, once.
func (a *Archiver) caughtUp(ctx context.Context, w *segmentWriter) error {
	if a.applied.Load() {
		return nil
	}
	if err := a.seal(w); err != nil {
		return err
	}
	if err := stream.ApplyRetention(ctx, a.js, a.cfg.Streams, a.cfg.Retention); err != nil {
		return err
	}
	a.applied.Store(true)
	a.log.Info("archive caught up with the stream", "sealed_seq", a.Sealed(), "retention", a.cfg.Retention.String())
	return nil
}

func (a *Archiver) seal(w *segmentWriter) error {
	if !w.open() {
		return nil
	}
	first := w.first
	if err := w.seal(); err != nil {
		return err
	}
	a.sealed.Store(w.next - 1)
	a.segments.Inc()
	a.log.Debug("archive segment sealed", "first_seq", first, "last_seq", w.next-1)
	return nil
}

// recordLost writes down, durably and loudly, that entries from to last
// expired before they were archived, and moves the writer past them.
func (a *Archiver) recordLost(w *segmentWriter, from, last uint64) error {
	if err := a.seal(w); err != nil {
		return err
	}
	head, known, nextLink := protocol.Genesis, false, "unknown"
	if a.cfg.LinkAt != nil {
		l, ok, err := a.cfg.LinkAt(last)
		if err != nil {
			return fmt.Errorf("archive: link at %d: %w", last, err)
		}
		if ok {
			head, known, nextLink = l, true, l.String()
		}
	}
	b, _ := json.Marshal(map[string]any{
		"first_seq": from, "last_seq": last, "recorded_at": time.Now().UTC(),
		"reason":    "not in the archive and no longer in the stream: it expired before it was archived (the archiver did not run for longer than the retention window), or its archive segment was removed",
		"next_link": nextLink,
	})
	if err := writeFileSync(filepath.Join(a.arch.dir, lostName(from, last)), append(b, '\n')); err != nil {
		return err
	}
	n := last - from + 1
	a.lost.Add(n)
	a.lostTotal.Add(float64(n))
	a.log.Error("archive: ledger history lost: entries neither in the archive nor in the stream (expired before they were archived, or their segment was removed)",
		"first_seq", from, "last_seq", last, "entries", n, "link_known", known)
	w.next, w.head = last+1, head
	return nil
}

// segmentWriter is the open segment: a temporary file written as entries
// arrive and renamed to its sealed name once complete and synced.
type segmentWriter struct {
	arch      *Archive
	stream    string
	next      uint64
	head      protocol.Link
	f         *os.File
	bw        *bufio.Writer
	v         *protocol.ChainVerifier
	first     uint64
	firstTime time.Time
	// minTTL is the shortest TTL of the open segment's entries (0: none).
	minTTL time.Duration
	size   int64
	line   []byte
}

func (w *segmentWriter) open() bool { return w.f != nil }

func (w *segmentWriter) tmpPath() string { return filepath.Join(w.arch.dir, "open.jsonl"+tmpSuffix) }

func (w *segmentWriter) add(e protocol.Entry) error {
	if w.f == nil {
		f, err := os.OpenFile(w.tmpPath(), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
		if err != nil {
			return fmt.Errorf("archive: open segment: %w", err)
		}
		w.f, w.bw = f, bufio.NewWriterSize(f, 1<<16)
		w.v = protocol.NewChainVerifier(e.Seq, w.head)
		w.first, w.firstTime, w.size, w.minTTL = e.Seq, e.Time, 0, 0
		hdr, _ := json.Marshal(stream.ExportHeader{Format: stream.ExportFormat, Version: stream.ExportVersion, Stream: w.stream, FromSeq: e.Seq, PrevLink: w.head.String()})
		if err := w.write(hdr); err != nil {
			return err
		}
	}
	if ttl := entryTTL(e.Headers); ttl > 0 && (w.minTTL == 0 || ttl < w.minTTL) {
		w.minTTL = ttl
	}
	w.v.Add(e.Seq, e.Subject, nats.Header(e.Headers), e.Data, nil)
	line, err := stream.AppendExportLine(w.line[:0], stream.ExportEntry{Entry: e, Link: w.v.Head().String()})
	if err != nil {
		return fmt.Errorf("archive: entry %d: %w", e.Seq, err)
	}
	w.line = line
	if err := w.write(line); err != nil {
		return err
	}
	w.next = e.Seq + 1
	return nil
}

// write appends one line to the open segment and counts its size.
func (w *segmentWriter) write(line []byte) error {
	n, err := w.bw.Write(line)
	if err == nil {
		err = w.bw.WriteByte('\n')
		n++
	}
	w.size += int64(n)
	if err != nil {
		return fmt.Errorf("archive: write segment: %w", err)
	}
	return nil
}

// seal writes the trailer, syncs, and renames the segment to its sealed
// name (then syncs the directory, so the rename survives a crash).
func (w *segmentWriter) seal() error {
	head := w.v.Head()
	tr, _ := json.Marshal(stream.ExportTrailer{End: true, Count: w.v.Count(), LastSeq: w.next - 1, Head: head.String()})
	if err := w.write(tr); err != nil {
		return err
	}
	if err := w.bw.Flush(); err != nil {
		return fmt.Errorf("archive: write segment: %w", err)
	}
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("archive: sync segment: %w", err)
	}
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("archive: close segment: %w", err)
	}
	w.f = nil
	if err := os.Rename(w.tmpPath(), filepath.Join(w.arch.dir, segmentName(w.first, w.next-1))); err != nil {
		return fmt.Errorf("archive: seal segment: %w", err)
	}
	if err := fsyncdir.Sync(w.arch.dir); err != nil {
		return err
	}
	w.head = head
	return nil
}

// abandon drops an open segment that was not sealed (a failure while
// following): its entries are read again from the stream.
func (w *segmentWriter) abandon() {
	if w.f != nil {
		_ = w.f.Close()
		_ = os.Remove(w.tmpPath())
		w.f = nil
	}
}

func writeFileSync(path string, b []byte) error {
	tmp := path + tmpSuffix
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("archive: write %s: %w", path, err)
	}
	return fsyncdir.Sync(filepath.Dir(path))
}
