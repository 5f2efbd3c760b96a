package projector_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// TestViewsSnapshotAPI: views.snapshot answers what APIConfig.Snapshot
// takes; a failure is internal with its reason, a process without the hook
// says it takes none, a body that is not an object is bad_request, and a
// subject with a project is not the operation's.
func TestViewsSnapshotAPI(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	p := newProjector(t, e, s, 64)
	want := protocol.ViewsSnapshotResult{Name: "views-f4-00000000000000000007-1795000000000", Version: 1, ViewsFormat: projector.ViewsFormat,
		Stream: "CG_LEDGER", AppliedSeq: 7, Digest: "d", Created: time.UnixMilli(1795000000000).UTC(), Size: 10, Files: 3, Target: "directory /x", DurationMS: 5}
	var fail atomic.Bool
	serve := func(hook func(context.Context) (protocol.ViewsSnapshotResult, error)) func() {
		api, err := p.ServeAPI(ctx, e.NC, e.L, projector.APIConfig{Snapshot: hook})
		require.NoError(t, err)
		return api.Stop
	}
	stop := serve(func(ctx context.Context) (protocol.ViewsSnapshotResult, error) {
		if fail.Load() {
			return protocol.ViewsSnapshotResult{}, errors.New("views still catching up")
		}
		return want, nil
	})
	c := client.New(e.NC, client.WithActor("oncall"))
	got, err := c.ViewsSnapshot(ctx)
	require.NoError(t, err)
	require.Equal(t, want, got)

	fail.Store(true)
	_, err = c.ViewsSnapshot(ctx)
	pe, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeInternal, pe.Code)
	require.Contains(t, pe.Message, "views still catching up")

	reply := func(subject, body string) protocol.APIReply {
		m, err := e.NC.Request(subject, []byte(body), 30*time.Second)
		require.NoError(t, err)
		var r protocol.APIReply
		require.NoError(t, json.Unmarshal(m.Data, &r))
		return r
	}
	r := reply(protocol.APISubject(protocol.GlobalProject, "oncall", protocol.OpViewsSnapshot), `[]`)
	require.False(t, r.OK)
	require.Equal(t, protocol.CodeBadRequest, r.Error.Code)
	require.Equal(t, []string{"body"}, fields(r.Error.Violations))
	r = reply(protocol.APISubject("p1", "oncall", protocol.OpViewsSnapshot), `{}`)
	require.False(t, r.OK)
	require.Equal(t, protocol.CodeBadRequest, r.Error.Code)
	require.Equal(t, []string{"subject"}, fields(r.Error.Violations))
	stop()

	// The listing answers what APIConfig.SnapshotList lists.
	wantList := protocol.ViewsSnapshotListResult{Target: "directory /x", Snapshots: []protocol.ViewsSnapshotResult{want}}
	api, err := p.ServeAPI(ctx, e.NC, e.L, projector.APIConfig{SnapshotList: func(context.Context) (protocol.ViewsSnapshotListResult, error) {
		return wantList, nil
	}})
	require.NoError(t, err)
	gotList, err := c.ViewsSnapshotList(ctx)
	require.NoError(t, err)
	require.Equal(t, wantList, gotList)
	r = reply(protocol.APISubject(protocol.GlobalProject, "oncall", protocol.OpViewsSnapshotList), `"x"`)
	require.Equal(t, protocol.CodeBadRequest, r.Error.Code)
	api.Stop()

	stop = serve(nil)
	defer stop()
	_, err = c.ViewsSnapshot(ctx)
	pe, ok = protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeInternal, pe.Code)
	require.Contains(t, pe.Message, "takes no snapshots")
	_, err = c.ViewsSnapshotList(ctx)
	pe, ok = protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeInternal, pe.Code)
}
