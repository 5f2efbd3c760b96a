package projector

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cockroachdb/pebble/v2"
)

// SetAfterCommit installs the commit hook (tests only).
func (p *Projector) SetAfterCommit(f func(applied uint64) error) { p.afterCommit = f }

// ApplyEntries applies entries (which must continue the store's sequence)
// in batches of batch, without NATS (benchmarks build large views with it).
func ApplyEntries(s *Store, entries []protocol.Entry, batch int) error {
	cp, err := s.checkpoint()
	if err != nil {
		return err
	}
	all := entries
	// Skips are looked up among the given entries, as the projector looks
	// them up in the stream.
	find := func(seq uint64) (protocol.SkipRecord, bool, error) {
		for _, e := range all {
			if rec, ok := protocol.ParseSkip(e.Seq, e.Subject, e.Headers, e.Data, seq); ok {
				return rec, true, nil
			}
		}
		return protocol.SkipRecord{}, false, nil
	}
	for len(entries) > 0 {
		n := min(batch, len(entries))
		a := newApplier(s, cp)
		var pending []pendingEntry
		for _, e := range entries[:n] {
			var pe pendingEntry
			var err error
			if a, pe, err = applyOrSkip(s, a, cp, pending, e, find); err != nil {
				_ = a.b.Close()
				return err
			}
			pending = append(pending, pe)
		}
		a.seal()
		if err := a.b.Commit(pebble.NoSync); err != nil {
			return err
		}
		a.committed()
		_ = a.b.Close()
		cp, entries = a.cp, entries[n:]
	}
	return nil
}

// SettleCompactions waits until Pebble has run no compaction for a second,
// or ctx ends: a benchmark then queries the LSM a running server settles
// into, not one still being compacted after its build. (Pebble's estimated
// compaction debt is not zero on a settled store, so it is not the test.)
func (s *Store) SettleCompactions(ctx context.Context) error {
	quiet := 0
	for quiet < 10 {
		if s.db.Metrics().Compact.NumInProgress == 0 {
			quiet++
		} else {
			quiet = 0
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// firstSeqs computes every project's first sequence from the
// project-scoped rows, as the applier defines it (tests check the index
// against it).
func firstSeqs(r reader) (map[string]uint64, error) {
	first := map[string]uint64{}
	for _, tag := range projectRowTags {
		p := key(tag).prefix()
		err := scan(r, p, nil, func(k, _ []byte) (bool, error) {
			rest := k[len(p):]
			j := bytes.IndexByte(rest, 0)
			if j < 0 || len(k) < len(p)+j+1+8 {
				return false, fmt.Errorf("malformed %s row %q", tag, k)
			}
			project := string(rest[:j])
			if !protocol.ValidIdentifier(project) {
				return true, nil
			}
			seq := trailingU64(k)
			if cur, ok := first[project]; !ok || seq < cur {
				first[project] = seq
			}
			return true, nil
		})
		if err != nil {
			return nil, err
		}
	}
	return first, nil
}

// SetMaxOverviewCalls lowers the overview's bound (tests only); the
// returned func restores it.
func SetMaxOverviewCalls(n int) func() {
	old := maxOverviewCalls
	maxOverviewCalls = n
	return func() { maxOverviewCalls = old }
}
