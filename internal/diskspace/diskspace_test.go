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

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"0": 0, "64MiB": 64 << 20, "1GiB": 1 << 30, "2TiB": 2 << 40, "65536KiB": 64 << 20,
		"9223372036854775807": MaxSize, "8388607TiB": 8388607 << 40,
	} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"9223372036854775808", "18446744073709551615", "8589934592GiB", "17179869185GiB", "8388608TiB"} {
		_, err := ParseSize(in)
		require.ErrorIs(t, err, ErrSizeTooLarge, in)
	}
	for _, in := range []string{"lots", "-1GiB", "1PiB", "1.5GiB", "64MB"} {
		_, err := ParseSize(in)
		require.Error(t, err, in)
		require.NotErrorIs(t, err, ErrSizeTooLarge, in)
	}
}
