package executor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProgressLogRateLimitsAndCaps: heartbeats and kept reports at most
// one per ProgressEvery, at most MaxProgressKept kept, the latest always in
// the record.
func TestProgressLogRateLimitsAndCaps(t *testing.T) {
	beats := 0
	l := newProgressLog(func() { beats++ })
	t0 := time.Unix(1000, 0)
	l.add(Progress{Progress: 1}, t0)
	l.add(Progress{Progress: 2}, t0.Add(100*time.Millisecond))
	l.add(Progress{Progress: 3}, t0.Add(200*time.Millisecond))
	require.Equal(t, 1, beats)
	s := l.snapshot()
	require.Len(t, s, 2)
	require.EqualValues(t, 1, s[0].Progress)
	require.EqualValues(t, 3, s[1].Progress)

	for i := 1; i <= 3*MaxProgressKept; i++ {
		l.add(Progress{Progress: float64(100 + i)}, t0.Add(time.Duration(i)*ProgressEvery))
	}
	require.Equal(t, 1+3*MaxProgressKept, beats)
	s = l.snapshot()
	require.Len(t, s, MaxProgressKept)
	require.EqualValues(t, 100+3*MaxProgressKept, s[len(s)-1].Progress, "the latest is kept at the cap")
	require.Nil(t, (*progressLog)(nil).snapshot())
}
