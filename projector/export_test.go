package projector

import (
	"github.com/cockroachdb/pebble/v2"

	"github.com/cgledger/cgledger/ledger"
)

// SetAfterCommit installs the commit hook (tests only).
func (p *Projector) SetAfterCommit(f func(applied uint64) error) { p.afterCommit = f }

// ApplyEntries applies entries (which must continue the store's sequence)
// in batches of batch, without NATS (benchmarks build large views with it).
func ApplyEntries(s *Store, entries []ledger.Entry, batch int) error {
	cp, err := s.checkpoint()
	if err != nil {
		return err
	}
	for len(entries) > 0 {
		n := min(batch, len(entries))
		a := newApplier(s, cp)
		for _, e := range entries[:n] {
			if err := a.apply(e); err != nil {
				_ = a.b.Close()
				return err
			}
		}
		if err := a.b.Commit(pebble.NoSync); err != nil {
			return err
		}
		a.committed()
		_ = a.b.Close()
		cp, entries = a.cp, entries[n:]
	}
	return nil
}
