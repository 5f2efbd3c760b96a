package snapshot

import (
	"context"
	"io"
)

// Target is where snapshots are kept.
type Target interface {
	// Put stores a snapshot's body under m.Name with m beside it; a Put
	// that does not return nil leaves nothing List shows.
	Put(ctx context.Context, m Manifest, body io.Reader) error
	// List returns every whole snapshot's manifest, newest first
	// (AppliedSeq, then Created).
	List(ctx context.Context) ([]Manifest, error)
	// Open reads the body of the named snapshot.
	Open(ctx context.Context, name string) (io.ReadCloser, error)
	// Delete removes the named snapshot.
	Delete(ctx context.Context, name string) error
	// String names the target for logs: "object store cgledger_views_<stream>" or "directory /path".
	String() string
}
