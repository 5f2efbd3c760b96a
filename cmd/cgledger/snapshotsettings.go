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

// serveOwned are the entries of the data directory that serve removes or
// replaces: a snapshot directory there would lose its snapshots.
var serveOwned = []string{"views", viewsRestoreTmp, viewsAsideDir, snapshotTmpDir, "jetstream"}

// snapshotDirClash names the directory serve owns that dir is, or lies
// under, with the data directory itself: "" when there is none. Symbolic
// links are followed as far as the paths exist.
func snapshotDirClash(dir, data string) string {
	d := resolved(dir)
	if d == "" {
		return ""
	}
	if d == resolved(data) {
		return data
	}
	for _, name := range serveOwned {
		owned := filepath.Join(data, name)
		if o := resolved(owned); o != "" && (d == o || strings.HasPrefix(d, o+string(filepath.Separator))) {
			return owned
		}
	}
	return ""
}

// resolved is path made absolute, with the symbolic links of its longest
// existing ancestor followed; "" when it cannot be made absolute.
func resolved(path string) string {
	p, err := filepath.Abs(path)
	if err != nil {
		return ""
	}
	rest := ""
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(p, rest)
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}
