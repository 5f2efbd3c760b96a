package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/snapshot"
)

// TestScheduleIgnoresSnapshotsFromTheFuture: the schedule skips a turn
// when the newest snapshot in the target is younger than its period, and a
// snapshot dated ahead of this clock (a replica's wrong clock, a planted
// manifest) does not count: trusted, it would put every turn off for years.
func TestScheduleIgnoresSnapshotsFromTheFuture(t *testing.T) {
	ctx := context.Background()
	d, err := snapshot.NewDir(t.TempDir())
	require.NoError(t, err)
	put := func(seq uint64, created time.Time) {
		m := snapshot.Manifest{Name: fmt.Sprintf("views-f4-%020d-%d", seq, created.UnixMilli()), Version: snapshot.Version,
			ViewsFormat: 4, Stream: "CG_LEDGER", AppliedSeq: seq, Created: created, Size: 3}
		require.NoError(t, d.Put(ctx, m, strings.NewReader("abc")))
	}
	c := &viewsSnapshotter{target: d}
	_, ok := c.newestAge(ctx)
	require.False(t, ok, "an empty target has no newest snapshot")

	put(9, time.Now().AddDate(3, 0, 0))
	_, ok = c.newestAge(ctx)
	require.False(t, ok, "a snapshot from the future is not the newest")

	put(5, time.Now().Add(-10*time.Minute))
	age, ok := c.newestAge(ctx)
	require.True(t, ok)
	require.GreaterOrEqual(t, age, 10*time.Minute, "the age of the newest snapshot dated in the past")
	require.Less(t, age, time.Hour)
}

// TestSnapshotCutShortSaysWhy: a snapshot asked for and cut short says why
// rather than a bare "context canceled" (docs/protocol.md#viewssnapshot):
// the snapshotter stopped or the request's context canceled is serve
// shutting down, the request's deadline is its time running out. Each is
// asked while another snapshot holds the snapshotter, so take waits until
// its context ends.
func TestSnapshotCutShortSaysWhy(t *testing.T) {
	busy := func() *viewsSnapshotter {
		c := &viewsSnapshotter{st: &serveState{}, busy: make(chan struct{}, 1)}
		c.busy <- struct{}{}
		c.ctx, c.stop = context.WithCancel(context.Background())
		t.Cleanup(c.stop)
		return c
	}

	c := busy()
	c.stop()
	_, err := c.take(context.Background(), "asked")
	require.ErrorIs(t, err, context.Canceled)
	require.Contains(t, err.Error(), "serve shut down while taking the snapshot", "the snapshotter stopped")

	asked, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = busy().take(asked, "asked")
	require.ErrorIs(t, err, context.Canceled)
	require.Contains(t, err.Error(), "serve shut down while taking the snapshot", "the API server stopped")

	asked, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err = busy().take(asked, "asked")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "the snapshot took longer than the request's time")
	require.NotContains(t, err.Error(), "shut down")
}
