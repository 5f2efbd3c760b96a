package snapshot

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
)

// Prune keeps the newest snapshots and removes what interrupted uploads
// left, on both targets; the kept ones still restore.
func TestPruneKeepsTheNewestAndRemovesOrphans(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 4)
	live := builtViews(t, ctx, e)
	for kind, tg := range targets(t, ctx, e, "snaps_prune") {
		t.Run(kind, func(t *testing.T) {
			var taken []Manifest
			for i := range 4 {
				m, err := take(ctx, live, tg, TakeOptions{Stream: ledgerStream}, later(int64(i), func(*Manifest) {}))
				require.NoError(t, err)
				taken = append(taken, m)
			}
			var orphans []string
			switch tg := tg.(type) {
			case *Dir:
				tg.staleAfter = 0
				orphans = []string{".views-f4-x.tar.123.tmp", snapshotName(4, 99, taken[0].Created) + bodyExt}
				for _, n := range orphans {
					require.NoError(t, os.WriteFile(filepath.Join(tg.path, n), []byte("partial"), 0o644))
				}
				// A snapshot whose body was truncated: never listed, so
				// only the purge removes it, manifest and body.
				truncated := taken[0]
				truncated.Name = snapshotName(4, 98, taken[0].Created)
				raw, err := json.Marshal(truncated)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join(tg.path, truncated.Name+manifestExt), raw, 0o644))
				require.NoError(t, os.WriteFile(filepath.Join(tg.path, truncated.Name+bodyExt), []byte("cut short"), 0o644))
				orphans = append(orphans, truncated.Name+manifestExt, truncated.Name+bodyExt)
			case *ObjectStore:
				tg.orphanAfter = 0
				subj := "$O." + tg.bucket + ".C.ORPHANNUID"
				for range 3 {
					_, err := e.JS.Publish(ctx, subj, []byte("chunk"))
					require.NoError(t, err)
				}
				orphans = []string{subj}
			}
			_, err := Prune(ctx, tg, 0)
			require.Error(t, err, "keep 0 is refused")

			removed, err := Prune(ctx, tg, 2)
			require.NoError(t, err)
			require.ElementsMatch(t, append([]string{taken[0].Name, taken[1].Name}, orphans...), removed)
			listed, err := tg.List(ctx)
			require.NoError(t, err)
			require.Equal(t, []string{taken[3].Name, taken[2].Name}, names(listed))
			switch tg := tg.(type) {
			case *Dir:
				ents, err := os.ReadDir(tg.path)
				require.NoError(t, err)
				require.Len(t, ents, 4, "two snapshots, body and manifest each")
			case *ObjectStore:
				s, err := e.JS.Stream(ctx, "OBJ_"+tg.bucket)
				require.NoError(t, err)
				info, err := s.Info(ctx, jetstream.WithSubjectFilter("$O."+tg.bucket+".C.>"))
				require.NoError(t, err)
				require.Len(t, info.State.Subjects, 2, "the chunks of the two kept objects only")
			}
			for _, m := range listed {
				r, err := tg.Open(ctx, m.Name)
				require.NoError(t, err)
				n, err := io.Copy(io.Discard, r)
				require.NoError(t, err)
				require.NoError(t, r.Close())
				require.Equal(t, m.Size, n)
			}
			again, err := Prune(ctx, tg, 2)
			require.NoError(t, err)
			require.Empty(t, again)
		})
	}
}
