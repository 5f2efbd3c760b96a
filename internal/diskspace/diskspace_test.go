package diskspace

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReserveIsTheOneInForce: the configured reserve, else the one computed
// from the file system's size (never more than 64 MiB, and not 0 on a real
// file system); 0 when the guard is off.
func TestReserveIsTheOneInForce(t *testing.T) {
	dir := t.TempDir()
	set := New(dir, 12345, false)
	require.NoError(t, set.Check())
	require.Equal(t, uint64(12345), set.Reserve())

	computed := New(dir, 0, false)
	_ = computed.Check()
	require.NotZero(t, computed.Reserve())
	require.LessOrEqual(t, computed.Reserve(), uint64(64<<20))

	off := New(dir, 12345, true)
	require.NoError(t, off.Check())
	require.Zero(t, off.Reserve())
}
