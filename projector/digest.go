package projector

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Digest is a SHA-256 over every row of every view, in key order: for each
// row, the 8-byte big-endian length of the key, the key, the 8-byte length of
// the value, the value (docs/views.md). Two stores with the same digest hold
// byte-identical views.
func (s *Store) Digest() (string, error) {
	it, err := s.db.NewIter(nil)
	if err != nil {
		return "", fmt.Errorf("projector: digest: %w", err)
	}
	defer it.Close()
	h := sha256.New()
	var n [8]byte
	for ok := it.First(); ok; ok = it.Next() {
		binary.BigEndian.PutUint64(n[:], uint64(len(it.Key())))
		h.Write(n[:])
		h.Write(it.Key())
		v := it.Value()
		binary.BigEndian.PutUint64(n[:], uint64(len(v)))
		h.Write(n[:])
		h.Write(v)
	}
	if err := it.Error(); err != nil {
		return "", fmt.Errorf("projector: digest: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
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
