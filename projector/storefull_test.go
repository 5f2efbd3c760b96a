package projector_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
)

// TestFailedStoreWriteIsAnErrorNotAPanic makes every write of the view
// store fail (a full disk, as the WAL sees it): Pebble gives up with a fatal
// log, and the projector must return an error matching ErrStoreBroken
// instead of taking the process down.
func TestFailedStoreWriteIsAnErrorNotAPanic(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	full := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return errors.New("write: no space left on device")
		}
		return nil
	})}
	s, err := projector.OpenStore(filepath.Join(t.TempDir(), "views"), projector.StoreOptions{FS: errorfs.Wrap(vfs.Default, full)})
	require.NoError(t, err)
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	full.On()
	err = p.CatchUp(ctx)
	require.ErrorIs(t, err, projector.ErrStoreBroken)
	require.Contains(t, err.Error(), "no space left on device")
	require.Zero(t, p.Applied(), "nothing counts as applied")
}

// TestWriteGuardStopsTheProjectorBeforeItWrites: with the guard refusing,
// CatchUp writes nothing and says why; once it allows, CatchUp goes on.
func TestWriteGuardStopsTheProjectorBeforeItWrites(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	low := errors.New("storage nearly full: test")
	var refuse = true
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry(), WriteGuard: func() error {
		if refuse {
			return low
		}
		return nil
	}})
	require.NoError(t, err)
	require.ErrorIs(t, p.CatchUp(ctx), low)
	applied, err := s.Applied()
	require.NoError(t, err)
	require.Zero(t, applied)
	refuse = false
	require.NoError(t, p.CatchUp(ctx))
	applied, err = s.Applied()
	require.NoError(t, err)
	require.NotZero(t, applied)
}

// TestBrokenStoreShutsDownCleanly: once a failed write broke the store,
// serve's shutdown syncs and closes it. Neither may panic (Pebble's fatal
// log panics, and after that its commit pipeline is left half-locked, so a
// close that flushes dies with "unlock of unlocked mutex", which nothing
// recovers): both answer ErrStoreBroken.
func TestBrokenStoreShutsDownCleanly(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	full := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return errors.New("write: no space left on device")
		}
		return nil
	})}
	s, err := projector.OpenStore(filepath.Join(t.TempDir(), "views"), projector.StoreOptions{FS: errorfs.Wrap(vfs.Default, full)})
	require.NoError(t, err)
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	full.On()
	require.ErrorIs(t, p.CatchUp(ctx), projector.ErrStoreBroken)
	require.ErrorIs(t, s.Sync(), projector.ErrStoreBroken, "sync of a broken store is an error, not a panic")
	require.ErrorIs(t, s.Close(), projector.ErrStoreBroken, "close of a broken store is an error, not a panic")
}

// TestSyncOnAFullDiskIsAnError: the first failed write can be shutdown's
// own sync (the projector's commits do not fsync). It breaks the store with
// an error, and the close after it does not touch Pebble again.
func TestSyncOnAFullDiskIsAnError(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	full := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return errors.New("write: no space left on device")
		}
		return nil
	})}
	s, err := projector.OpenStore(filepath.Join(t.TempDir(), "views"), projector.StoreOptions{FS: errorfs.Wrap(vfs.Default, full)})
	require.NoError(t, err)
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, p.CatchUp(ctx))
	require.NotZero(t, p.Applied())
	full.On()
	err = s.Sync()
	require.ErrorIs(t, err, projector.ErrStoreBroken)
	require.Contains(t, err.Error(), "no space left on device")
	require.ErrorIs(t, s.Close(), projector.ErrStoreBroken)
}

// TestCloseOnAFullDiskReturns: shutdown closes the view store on a full
// disk. A flush there fails in ways nothing recovers (Pebble panics while
// rotating its log, then unlocks an unlocked mutex) or that never end
// (Pebble retries a failed flush for ever): Close must return, and what was
// committed must be there at the next open.
func TestCloseOnAFullDiskReturns(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	full := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return errors.New("write: no space left on device")
		}
		return nil
	})}
	dir := filepath.Join(t.TempDir(), "views")
	s, err := projector.OpenStore(dir, projector.StoreOptions{FS: errorfs.Wrap(vfs.Default, full)})
	require.NoError(t, err)
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, p.CatchUp(ctx))
	require.NoError(t, s.Sync())
	full.On()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		// The log's end marker may not fit: an error, not a panic.
		t.Logf("close on a full disk: %v", err)
	case <-time.After(2 * time.Minute):
		require.Fail(t, "Close hangs on a full disk")
	}
	full.Off()
	s, err = projector.OpenStore(dir, projector.StoreOptions{})
	require.NoError(t, err)
	defer s.Close()
	applied, err := s.Applied()
	require.NoError(t, err)
	require.Equal(t, p.Applied(), applied, "the committed views are back from the log")
}

// TestOpenWaitsOutAFlushThatFindsNoRoom: views closed with their last
// batches in the write-ahead log are flushed when they are opened again.
// When that flush cannot write its table (a full disk), Pebble retries it
// and OpenStore waits; BackgroundError says why, and once writes go through
// the store opens with every committed batch.
func TestOpenWaitsOutAFlushThatFindsNoRoom(t *testing.T) {
	e := ledgertest.New(t)
	e.Scenario(t, 3)
	ctx := ledgertest.Ctx(t)
	dir := filepath.Join(t.TempDir(), "views")
	s, err := projector.OpenStore(dir, projector.StoreOptions{})
	require.NoError(t, err)
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, p.CatchUp(ctx))
	require.NoError(t, s.Sync())
	require.NoError(t, s.Close())

	full := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.HasSuffix(op.Path, ".sst") {
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	})}
	full.On()
	failures := make(chan error, 1)
	opened := make(chan error, 1)
	var reopened *projector.Store
	go func() {
		var err error
		reopened, err = projector.OpenStore(dir, projector.StoreOptions{FS: errorfs.Wrap(vfs.Default, full), BackgroundError: func(err error) {
			select {
			case failures <- err:
			default:
			}
		}})
		opened <- err
	}()
	select {
	case err := <-failures:
		require.ErrorIs(t, err, syscall.ENOSPC, "the failed flush is reported")
	case err := <-opened:
		require.Failf(t, "the store opened while no table could be written", "err %v", err)
	case <-time.After(time.Minute):
		require.Fail(t, "no failed flush reported")
	}
	select {
	case err := <-opened:
		require.Failf(t, "the store opened while no table could be written", "err %v", err)
	default:
	}
	full.Off()
	select {
	case err := <-opened:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		require.Fail(t, "the store did not open once tables could be written")
	}
	defer reopened.Close()
	applied, err := reopened.Applied()
	require.NoError(t, err)
	require.Equal(t, p.Applied(), applied, "every committed batch is there")
}
