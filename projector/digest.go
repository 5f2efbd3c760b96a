package projector

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Digest is a SHA-256 over every row of every view, in key order: for each
// row, the 8-byte big-endian length of the key, the key, the 8-byte length of
// the value, the value (docs/views.md). Two stores with the same digest hold
// byte-identical views.
func (s *Store) Digest() (string, error) {
	d, err := s.DigestNow()
	return d.Digest, err
}

// DigestResult is a digest with the applied sequence and chain head it
// belongs to (the body of GET /v1/digest).
type DigestResult struct {
	AppliedSeq uint64 `json:"applied_seq"`
	Digest     string `json:"digest"`
	ChainHead  string `json:"chain_head"`
}

// DigestNow computes the digest, applied sequence and chain head from one
// snapshot, so the three agree even while the projector applies.
func (s *Store) DigestNow() (DigestResult, error) {
	snap := s.db.NewSnapshot()
	defer snap.Close()
	var res DigestResult
	cp := checkpoint{}
	if raw, ok, err := get(snap, metaApplied); err != nil {
		return res, fmt.Errorf("projector: digest: %w", err)
	} else if ok {
		if cp, err = decodeCheckpoint(raw); err != nil {
			return res, err
		}
	}
	res.AppliedSeq, res.ChainHead = cp.Applied, cp.Head.String()
	sum, err := s.hashRows(snap)
	if err != nil {
		return res, err
	}
	res.Digest = hex.EncodeToString(sum)
	return res, nil
}

// Dump calls fn for every row in key order (tests compare whole stores with it).
func (s *Store) Dump(fn func(k, v []byte) error) error {
	it, err := s.db.NewIter(&pebble.IterOptions{})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		if err := fn(it.Key(), it.Value()); err != nil {
			return err
		}
	}
	return it.Error()
}

// Rebuild drops every view and re-applies the ledger from sequence 1 up to
// the stream's current last sequence.
func (p *Projector) Rebuild(ctx context.Context) error {
	if err := p.store.Reset(); err != nil {
		return err
	}
	p.applied.Store(0)
	p.m.appliedTo.Set(0)
	return p.CatchUp(ctx)
}
