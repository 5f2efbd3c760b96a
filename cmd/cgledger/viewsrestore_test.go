package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSettleRestore: what a restore killed at each step leaves is settled
// at the next start: views moved aside with nothing (or an empty directory)
// in their place are put back; with a restored store in place they are
// removed; a partial unpack is removed.
func TestSettleRestore(t *testing.T) {
	write := func(path string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o750))
		require.NoError(t, os.WriteFile(path, []byte(filepath.Base(path)), 0o600))
	}
	read := func(path string) string {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return string(b)
	}
	gone := func(path string) {
		_, err := os.Stat(path)
		require.ErrorIs(t, err, os.ErrNotExist, path)
	}
	for _, c := range []struct {
		name        string
		views       string // "": missing; "empty"; "restored"
		wantFromOld bool
	}{
		{"killed after the move, before the unpack", "", true},
		{"killed with an empty views directory", "empty", true},
		{"killed after the rename, before the removal", "restored", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := t.TempDir()
			write(filepath.Join(data, viewsAsideDir, "OLD"))
			write(filepath.Join(data, viewsRestoreTmp, ".cgledger-restore-views-1", "PARTIAL"))
			switch c.views {
			case "empty":
				require.NoError(t, os.Mkdir(filepath.Join(data, "views"), 0o750))
			case "restored":
				write(filepath.Join(data, "views", "RESTORED"))
			}
			require.NoError(t, settleRestore(data))
			gone(filepath.Join(data, viewsAsideDir))
			gone(filepath.Join(data, viewsRestoreTmp))
			if c.wantFromOld {
				require.Equal(t, "OLD", read(filepath.Join(data, "views", "OLD")))
			} else {
				require.Equal(t, "RESTORED", read(filepath.Join(data, "views", "RESTORED")))
				gone(filepath.Join(data, "views", "OLD"))
			}
			require.NoError(t, settleRestore(data), "settling twice changes nothing")
		})
	}
	// Nothing to settle: the views stay as they are.
	data := t.TempDir()
	write(filepath.Join(data, "views", "CURRENT"))
	require.NoError(t, settleRestore(data))
	require.Equal(t, "CURRENT", read(filepath.Join(data, "views", "CURRENT")))
}
