// Package archive keeps the ledger's history beyond the stream's retention
// window: sealed segment files, in the export format, that an Archiver
// copies from the stream before its entries expire, and a History that
// reads the segments and then the stream as one chain
// (docs/durability.md, "History beyond one stream").
package archive

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// Archive is a directory of sealed segments. Each segment is a complete
// export file (a header with the link before its first entry, its entries
// with their links, a trailer with its head) named by its first and last
// sequence, so `cgledger verify` reads any one of them on its own.
type Archive struct {
	dir string
}

// Segment is one sealed segment file.
type Segment struct {
	First, Last uint64
	Path        string
}

// tmpSuffix marks the segment being written; a crash leaves it behind and
// Open removes it (its entries are still in the stream, well inside the
// window, and are archived again).
const tmpSuffix = ".tmp"

// Open opens (creating it if needed) the archive in dir and removes any
// segment a crash left unsealed.
func Open(dir string) (*Archive, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), tmpSuffix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return nil, fmt.Errorf("archive: remove unsealed segment: %w", err)
			}
		}
	}
	return &Archive{dir: dir}, nil
}

// Dir is the archive's directory.
func (a *Archive) Dir() string { return a.dir }

func segmentName(first, last uint64) string {
	return fmt.Sprintf("%020d-%020d.jsonl", first, last)
}

func lostName(first, last uint64) string {
	return fmt.Sprintf("lost-%020d-%020d.json", first, last)
}

// parseRange reads "<first>-<last><suffix>" after prefix.
func parseRange(name, prefix, suffix string) (first, last uint64, ok bool) {
	if !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, suffix) {
		return 0, 0, false
	}
	a, b, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(name, prefix), suffix), "-")
	if !ok {
		return 0, 0, false
	}
	f, err1 := strconv.ParseUint(a, 10, 64)
	l, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil || f == 0 || l < f {
		return 0, 0, false
	}
	return f, l, true
}

// Segments lists the sealed segments in sequence order.
func (a *Archive) Segments() ([]Segment, error) {
	ents, err := os.ReadDir(a.dir)
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	var segs []Segment
	for _, e := range ents {
		if f, l, ok := parseRange(e.Name(), "", ".jsonl"); ok {
			segs = append(segs, Segment{First: f, Last: l, Path: filepath.Join(a.dir, e.Name())})
		}
	}
	slices.SortFunc(segs, func(x, y Segment) int {
		if x.First < y.First {
			return -1
		}
		if x.First > y.First {
			return 1
		}
		return 0
	})
	return segs, nil
}

// Lost lists the ranges of sequences recorded as lost: they expired from
// the stream before the archiver could copy them (serve was down longer
// than the retention window).
func (a *Archive) Lost() ([][2]uint64, error) {
	ents, err := os.ReadDir(a.dir)
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	var lost [][2]uint64
	for _, e := range ents {
		if f, l, ok := parseRange(e.Name(), "lost-", ".json"); ok {
			lost = append(lost, [2]uint64{f, l})
		}
	}
	return lost, nil
}

// Last returns the last archived sequence and the chain link after it
// (0 and the genesis link for an empty archive), read from the last
// segment's trailer.
func (a *Archive) Last() (uint64, protocol.Link, error) {
	segs, err := a.Segments()
	if err != nil || len(segs) == 0 {
		return 0, protocol.Genesis, err
	}
	s := segs[len(segs)-1]
	tr, err := readTrailer(s.Path)
	if err != nil {
		return 0, protocol.Genesis, err
	}
	if tr.LastSeq != s.Last {
		return 0, protocol.Genesis, fmt.Errorf("archive: segment %s: trailer ends at seq %d, not %d", s.Path, tr.LastSeq, s.Last)
	}
	head, err := protocol.ParseLink(tr.Head)
	if err != nil {
		return 0, protocol.Genesis, fmt.Errorf("archive: segment %s: trailer head: %w", s.Path, err)
	}
	return s.Last, head, nil
}

// readTrailer reads a segment's last line, its trailer, without reading
// the whole file.
func readTrailer(path string) (stream.ExportTrailer, error) {
	var tr stream.ExportTrailer
	f, err := os.Open(path)
	if err != nil {
		return tr, fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return tr, fmt.Errorf("archive: %w", err)
	}
	n := min(st.Size(), 4096)
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, st.Size()-n); err != nil && !errors.Is(err, io.EOF) {
		return tr, fmt.Errorf("archive: read trailer of %s: %w", path, err)
	}
	buf = []byte(strings.TrimRight(string(buf), "\n"))
	if i := strings.LastIndexByte(string(buf), '\n'); i >= 0 {
		buf = buf[i+1:]
	}
	if err := json.Unmarshal(buf, &tr); err != nil || !tr.End {
		return tr, fmt.Errorf("archive: segment %s has no trailer: %v", path, err)
	}
	return tr, nil
}

// errStop ends a segment read early once the range asked for is done.
var errStop = errors.New("stop")

// ReadRange calls fn for every archived entry from from to to, in order.
// Every segment it reads is verified as it streams: its chain from the
// link in its header, its trailer, and its header against the previous
// segment's head, so an edited or truncated segment is an error naming it.
// A sequence in the range that no segment holds wraps stream.ErrHistoryLost.
func (a *Archive) ReadRange(ctx context.Context, from, to uint64, fn func(protocol.Entry) error) error {
	if from == 0 {
		from = 1
	}
	if to < from {
		return nil
	}
	segs, err := a.Segments()
	if err != nil {
		return err
	}
	next := from
	var prevHead *protocol.Link
	relisted := false
	for i := 0; i < len(segs); i++ {
		s := segs[i]
		if s.Last < next {
			continue
		}
		if s.First > next && !relisted {
			// A directory listing made while the archiver renames a
			// segment into place may miss an entry (readdir is unspecified
			// for a directory changed during it): list once more before
			// calling the range lost.
			relisted = true
			if segs, err = a.Segments(); err != nil {
				return err
			}
			i = -1
			continue
		}
		if s.First > next {
			return a.gapError(next, min(s.First-1, to))
		}
		head, err := readSegment(ctx, s, prevHead, next, to, fn)
		if err != nil {
			return err
		}
		prevHead = &head
		next = s.Last + 1
		if next > to {
			return nil
		}
	}
	return fmt.Errorf("%w: the archive in %s ends at seq %d, before %d", stream.ErrHistoryLost, a.dir, next-1, to)
}

// gapError says which entries no segment holds, and whether the archiver
// recorded them as lost (expired before it copied them) or they are missing
// without a record (a segment removed).
func (a *Archive) gapError(from, to uint64) error {
	if r, ok, err := a.LostAt(from); err == nil && ok {
		return fmt.Errorf("%w: no archive segment holds entries %d to %d (%s): entries %d to %d are recorded as lost", stream.ErrHistoryLost, from, to, a.dir, r.First, r.Last)
	}
	return fmt.Errorf("%w: no archive segment holds entries %d to %d (%s), and no loss is recorded for them", stream.ErrHistoryLost, from, to, a.dir)
}

// ErrBadSegment is returned for a segment whose contents do not verify.
// It matches stream.ErrHistoryCorrupt too, so readers that know only the
// ledger (verification) can tell it from a failure to read.
var ErrBadSegment = fmt.Errorf("archive segment does not verify (%w)", stream.ErrHistoryCorrupt)

func readSegment(ctx context.Context, s Segment, prevHead *protocol.Link, from, to uint64, fn func(protocol.Entry) error) (protocol.Link, error) {
	f, err := os.Open(s.Path)
	if err != nil {
		return protocol.Link{}, fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	var v *protocol.ChainVerifier
	onHeader := func(h stream.ExportHeader) error {
		if h.FromSeq != s.First {
			return fmt.Errorf("%w: %s: header from_seq %d, name says %d", ErrBadSegment, s.Path, h.FromSeq, s.First)
		}
		prev, err := protocol.ParseLink(h.PrevLink)
		if err != nil {
			return fmt.Errorf("%w: %s: header prev_link: %v", ErrBadSegment, s.Path, err)
		}
		if prevHead != nil && prev != *prevHead {
			return fmt.Errorf("%w: %s: its prev_link %s is not the previous segment's head %s", ErrBadSegment, s.Path, prev, prevHead)
		}
		v = protocol.NewChainVerifier(h.FromSeq, prev)
		return nil
	}
	_, tr, err := stream.ReadExport(f, onHeader, func(e stream.ExportEntry) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		want, err := protocol.ParseLink(e.Link)
		if err != nil {
			return fmt.Errorf("%w: %s: seq %d link: %v", ErrBadSegment, s.Path, e.Seq, err)
		}
		if !v.Add(e.Seq, e.Subject, nats.Header(e.Headers), e.Data, &want) {
			bad, why := v.FirstBad()
			return fmt.Errorf("%w: %s: seq %d: %s", ErrBadSegment, s.Path, bad, why)
		}
		if e.Seq < from {
			return nil
		}
		if err := fn(e.Entry); err != nil {
			return err
		}
		if e.Seq >= to {
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) {
		return v.Head(), nil
	}
	if err != nil {
		if errors.Is(err, stream.ErrBadExport) {
			return protocol.Link{}, fmt.Errorf("%w: %s: %v", ErrBadSegment, s.Path, err)
		}
		return protocol.Link{}, err
	}
	if tr == nil || tr.Head != v.Head().String() || tr.LastSeq != s.Last || tr.Count != v.Count() {
		return protocol.Link{}, fmt.Errorf("%w: %s: trailer missing or not matching its %d entries (ending at seq %d)", ErrBadSegment, s.Path, v.Count(), s.Last)
	}
	return v.Head(), nil
}

// LostAt returns the recorded lost range that holds seq, if any.
func (a *Archive) LostAt(seq uint64) (stream.LostRange, bool, error) {
	lost, err := a.Lost()
	if err != nil {
		return stream.LostRange{}, false, err
	}
	for _, r := range lost {
		if seq < r[0] || seq > r[1] {
			continue
		}
		lr := stream.LostRange{First: r[0], Last: r[1]}
		b, err := os.ReadFile(filepath.Join(a.dir, lostName(r[0], r[1])))
		if err != nil {
			return lr, false, fmt.Errorf("archive: %w", err)
		}
		var m struct {
			NextLink string `json:"next_link"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return lr, false, fmt.Errorf("archive: %s: %w", lostName(r[0], r[1]), err)
		}
		if l, err := protocol.ParseLink(m.NextLink); err == nil {
			lr.Next, lr.NextKnown = l, true
		}
		return lr, true, nil
	}
	return stream.LostRange{}, false, nil
}

// readHeader reads a segment's first line, its header.
func readHeader(path string) (stream.ExportHeader, error) {
	var h stream.ExportHeader
	f, err := os.Open(path)
	if err != nil {
		return h, fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	line, err := bufio.NewReaderSize(f, 4096).ReadSlice('\n')
	if err != nil {
		return h, fmt.Errorf("%w: %s: no header: %v", ErrBadSegment, path, err)
	}
	if err := json.Unmarshal(line, &h); err != nil || h.Format != stream.ExportFormat {
		return h, fmt.Errorf("%w: %s: line 1 is not a header", ErrBadSegment, path)
	}
	return h, nil
}

// LastSeq is the last archived sequence (0 for an empty archive).
func (a *Archive) LastSeq() (uint64, error) {
	last, _, err := a.Last()
	return last, err
}
