package snapshot

import (
	"context"
	"errors"

	"github.com/cgledger/cgledger/projector"
)

// TakeOptions configures Take. The zero value takes a snapshot of no named
// stream in os.TempDir.
type TakeOptions struct {
	// Stream is the ledger stream the views were built from.
	Stream string
	// Host names the taker in the manifest; empty leaves it out.
	Host string
	// TempDir is where the checkpoint is made; "" means os.TempDir.
	TempDir string
}

// Take writes a consistent snapshot of s to t and returns its manifest.
func Take(ctx context.Context, s *projector.Store, t Target, o TakeOptions) (Manifest, error) {
	return Manifest{}, errors.New("snapshot: not implemented")
}
