package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// defaultViewsSnapshotEvery is views_snapshot_every's default: a replica
// that restores the newest snapshot then applies at most about an hour of
// entries instead of the whole ledger, while a snapshot (a checkpoint of
// hard links, its digest read back and one upload of the store) costs a few
// minutes of one core an hour at most on a ledger of a million calls
// (docs/decisions.md, issue 31, "snapserve").
const defaultViewsSnapshotEvery = "1h"

// minViewsSnapshotEvery is the shortest schedule: each snapshot reads and
// uploads the whole store.
const minViewsSnapshotEvery = 10 * time.Second

// parseSnapshotEvery reads views_snapshot_every: 0 for never ("0", "off"),
// else a duration of at least minViewsSnapshotEvery; empty is the default.
func parseSnapshotEvery(v string) (time.Duration, error) {
	switch v {
	case "":
		v = defaultViewsSnapshotEvery
	case "0", "off":
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("views_snapshot_every %q: %w", v, err)
	}
	if d < minViewsSnapshotEvery {
		return 0, fmt.Errorf("views_snapshot_every %q: shorter than %s", v, minViewsSnapshotEvery)
	}
	return d, nil
}

// inside reports whether path is dir or lies under it.
func inside(path, dir string) bool {
	p, err1 := filepath.Abs(path)
	d, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	return p == d || strings.HasPrefix(p, d+string(filepath.Separator))
}
