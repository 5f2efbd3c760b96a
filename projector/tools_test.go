package projector_test

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

func TestToolRegistryVersionsAsOf(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	def := func(desc string) []byte {
		return []byte(`{"tool_name":"search","description":"` + desc + `","parameters":{"type":"object"},"target_subject":"cg.v1.{project_id}.{channel_id}.cmd.tool.http.search","after_execution":"suspend"}`)
	}
	v1, err := e.L.RegisterToolYAML(ctx, "proj", def("v1"))
	require.NoError(t, err)
	_, err = e.L.RegisterToolYAML(ctx, "proj", []byte(`{"tool_name":"echo2","parameters":{"type":"object"},"target_subject":"cg.v1.{project_id}.{channel_id}.cmd.tool.echo","after_execution":"terminate"}`))
	require.NoError(t, err)
	v2, err := e.L.RegisterToolYAML(ctx, "proj", def("v2"))
	require.NoError(t, err)

	s := openStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	require.NoError(t, newProjector(t, e, s, 8).CatchUp(ctx))
	q := projector.NewQueries(s)

	h, err := q.Tool("proj", "search", projector.AsOf{})
	require.NoError(t, err)
	require.Len(t, h.Versions, 2, "every version is kept")
	require.Equal(t, v2.Seq, h.Current.Seq)
	var d protocol.ToolDefinition
	require.NoError(t, json.Unmarshal(h.Current.Definition, &d))
	require.Equal(t, "v2", d.Description)

	old, err := q.Tool("proj", "search", projector.AsOf{Seq: v1.Seq})
	require.NoError(t, err)
	require.Len(t, old.Versions, 1)
	require.NoError(t, json.Unmarshal(old.Current.Definition, &d))
	require.Equal(t, "v1", d.Description)

	all, err := q.Tools("proj", projector.AsOf{})
	require.NoError(t, err)
	require.Len(t, all.Items, 2)
	before, err := q.Tools("proj", projector.AsOf{Seq: v1.Seq})
	require.NoError(t, err)
	require.Len(t, before.Items, 1, "echo2 was registered later")
	_, err = q.Tool("proj", "nope", projector.AsOf{})
	require.ErrorIs(t, err, protocol.ErrNotFound)
}
