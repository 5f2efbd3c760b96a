package snapshot

import (
	"context"
	"fmt"
)

// orphanPurger is a Target that can remove what interrupted Puts left
// (Dir, ObjectStore).
type orphanPurger interface {
	PurgeOrphans(ctx context.Context) ([]string, error)
}

// Prune deletes all but the newest keep snapshots of t (List's order) and
// returns the names it removed, then removes what interrupted uploads left
// in t (their temporary files or chunks, named in removed too). keep below
// 1 is refused: pruning never removes the last snapshot.
func Prune(ctx context.Context, t Target, keep int) (removed []string, err error) {
	if keep < 1 {
		return nil, fmt.Errorf("snapshot: prune %s: keep is %d, it must be at least 1", t, keep)
	}
	ms, err := t.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshot: prune: %w", err)
	}
	for _, m := range ms[min(keep, len(ms)):] {
		if err := t.Delete(ctx, m.Name); err != nil {
			return removed, fmt.Errorf("snapshot: prune: %w", err)
		}
		removed = append(removed, m.Name)
	}
	if p, ok := t.(orphanPurger); ok {
		orphans, err := p.PurgeOrphans(ctx)
		removed = append(removed, orphans...)
		if err != nil {
			return removed, fmt.Errorf("snapshot: prune: %w", err)
		}
	}
	return removed, nil
}
