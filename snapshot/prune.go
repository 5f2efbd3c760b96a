package snapshot

import (
	"context"
	"errors"
)

// Prune deletes all but the newest keep snapshots of t and returns the names
// it removed.
func Prune(ctx context.Context, t Target, keep int) (removed []string, err error) {
	return nil, errors.New("snapshot: not implemented")
}
