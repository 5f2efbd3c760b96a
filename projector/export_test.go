package projector

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// SetAfterCommit installs the commit hook (tests only).
func (p *Projector) SetAfterCommit(f func(applied uint64) error) { p.afterCommit = f }

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
