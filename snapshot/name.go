package snapshot

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"time"
)

// nameRE is the form of every snapshot name (Manifest.Name). Targets refuse
// other names, so a name can never reach outside a Dir's directory.
var nameRE = regexp.MustCompile(`^views-f[0-9]+-[0-9]{20}-[0-9]+$`)

// snapshotName is the name of a snapshot of views format format at
// applied sequence seq taken at created: sorting names sorts by format,
// then sequence, then time.
func snapshotName(format int, seq uint64, created time.Time) string {
	return fmt.Sprintf("views-f%d-%020d-%d", format, seq, created.UnixMilli())
}

// checkName refuses a name that is not a snapshot name.
func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("snapshot: %q is not a snapshot name (views-f<format>-<applied seq, 20 digits>-<unix ms>)", name)
	}
	return nil
}

// sortNewestFirst orders manifests newest first: by AppliedSeq, then
// Created, then Name (so the order is total).
func sortNewestFirst(ms []Manifest) {
	slices.SortFunc(ms, func(a, b Manifest) int {
		if c := cmp.Compare(b.AppliedSeq, a.AppliedSeq); c != 0 {
			return c
		}
		if c := b.Created.Compare(a.Created); c != 0 {
			return c
		}
		return cmp.Compare(b.Name, a.Name)
	})
}
