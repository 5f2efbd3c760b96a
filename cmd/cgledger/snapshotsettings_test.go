package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestValidateViewsSnapshotSettings: the schedule is off or at least
// 10s, the count 1 to 1000, the directory outside the views a restore
// replaces; every problem is listed at once.
func TestValidateViewsSnapshotSettings(t *testing.T) {
	for _, c := range []struct {
		every string
		want  time.Duration
		ok    bool
	}{
		{"", time.Hour, true}, {"1h", time.Hour, true}, {"10s", 10 * time.Second, true}, {"0", 0, true}, {"off", 0, true},
		{"9s", 0, false}, {"-1h", 0, false}, {"hourly", 0, false}, {"1d", 0, false},
	} {
		s := defaultSettings()
		s.ViewsSnapshotEvery = c.every
		d, err := parseSnapshotEvery(c.every)
		if c.ok {
			require.NoError(t, err, c.every)
			require.Equal(t, c.want, d, c.every)
			require.Empty(t, s.validate(), c.every)
		} else {
			require.Error(t, err, c.every)
			require.Equal(t, []string{"views_snapshot_every"}, fields(s.validate()), c.every)
		}
	}
	s := defaultSettings()
	s.Data = t.TempDir()
	s.ViewsSnapshotEvery, s.ViewsSnapshotKeep, s.ViewsSnapshotDir = "1s", 0, filepath.Join(s.Data, "views", "snaps")
	require.Equal(t, []string{"views_snapshot_dir", "views_snapshot_every", "views_snapshot_keep"}, fields(s.validate()))
	s.ViewsSnapshotKeep, s.ViewsSnapshotDir = 1001, filepath.Join(s.Data, "views")
	require.Equal(t, []string{"views_snapshot_dir", "views_snapshot_every", "views_snapshot_keep"}, fields(s.validate()))
	s.ViewsSnapshotEvery, s.ViewsSnapshotKeep, s.ViewsSnapshotDir = "2h", 1000, filepath.Join(s.Data, "views-snapshots")
	require.Empty(t, s.validate(), "a directory beside the views")
}

// TestSnapshotDirMayNotBeWhereServeRemovesThings: serve removes its
// checkpoint and restore directories and replaces the views, so a snapshot
// directory there (or the data directory itself, or one reached by a
// symbolic link into them) would lose every snapshot it holds.
func TestSnapshotDirMayNotBeWhereServeRemovesThings(t *testing.T) {
	s := defaultSettings()
	s.Data = t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.MkdirAll(filepath.Join(s.Data, "views"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(s.Data, "views"), link))
	for _, dir := range []string{
		s.Data, s.Data + "/", filepath.Join(s.Data, "views"), filepath.Join(s.Data, "views", "snaps"),
		filepath.Join(s.Data, "snapshots.tmp"), filepath.Join(s.Data, "views.restoring"),
		filepath.Join(s.Data, "views.replaced", "x"), filepath.Join(s.Data, "jetstream"),
		filepath.Join(s.Data, "views", "..", "snapshots.tmp"), filepath.Join(link, "snaps"),
	} {
		s.ViewsSnapshotDir = dir
		vs := s.validate()
		require.Equal(t, []string{"views_snapshot_dir"}, fields(vs), dir)
		require.Contains(t, vs[0].Message, "serve removes or replaces", dir)
	}
	for _, dir := range []string{
		filepath.Join(s.Data, "snapshots"), filepath.Join(s.Data, "views-snapshots"), filepath.Join(s.Data, "viewsx"), t.TempDir(),
	} {
		s.ViewsSnapshotDir = dir
		require.Empty(t, s.validate(), dir)
	}
}

// TestLoadViewsSnapshotSettings: the defaults (hourly, keep 3, the Object
// Store, restore on), and each set from the file, the environment and
// flags; --views-restore=false turns the restore off.
func TestLoadViewsSnapshotSettings(t *testing.T) {
	clearEnv(t)
	s, source, err := loadWith(t)
	require.NoError(t, err)
	require.Equal(t, "1h", s.ViewsSnapshotEvery)
	require.Equal(t, 3, s.ViewsSnapshotKeep)
	require.Empty(t, s.ViewsSnapshotDir)
	require.True(t, s.ViewsRestore)
	require.Equal(t, "default", source["views_restore"])

	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("views_snapshot_keep: 5\nviews_snapshot_dir: /srv/snaps\n"), 0o600))
	t.Setenv("CGLEDGER_VIEWS_SNAPSHOT_EVERY", "off")
	s, source, err = loadWith(t, "--config", cfg, "--views-restore=false")
	require.NoError(t, err)
	require.Equal(t, 5, s.ViewsSnapshotKeep)
	require.Equal(t, "/srv/snaps", s.ViewsSnapshotDir)
	require.Equal(t, "off", s.ViewsSnapshotEvery)
	require.False(t, s.ViewsRestore)
	require.Equal(t, "flag --views-restore", source["views_restore"])
	require.Equal(t, "env CGLEDGER_VIEWS_SNAPSHOT_EVERY", source["views_snapshot_every"])

	t.Setenv("CGLEDGER_VIEWS_SNAPSHOT_KEEP", "three")
	_, _, err = loadWith(t)
	require.ErrorContains(t, err, "views_snapshot_keep")
}
