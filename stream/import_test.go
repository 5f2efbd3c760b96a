package stream_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/stream"
)

// importTarget is an empty ledger stream on a server of its own.
func importTarget(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	require.NoError(t, stream.Provision(ctxT(t), js, stream.Config{}))
	return js
}

func TestImportVerifiedLoadsAFileInOnePass(t *testing.T) {
	tr, file, _ := exported(t, 3)

	js := importTarget(t)
	var seen uint64
	rep, err := stream.ImportVerified(ctxT(t), js, stream.DefaultName, bytes.NewReader(file), stream.ImportConfig{InFlight: 2, Progress: func(n uint64) { seen = n }})
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.Equal(t, tr.Head, rep.Head)
	require.Equal(t, tr.Count, seen)
	s, err := js.Stream(ctxT(t), stream.DefaultName)
	require.NoError(t, err)
	require.Equal(t, tr.LastSeq, s.CachedInfo().State.LastSeq, "every entry at its own sequence")
}

func TestImportVerifiedStopsAtTheFirstBadEntry(t *testing.T) {
	_, _, lines := exported(t, 3)
	// Edit the data of the fourth entry and leave its recorded link.
	var ee stream.ExportEntry
	require.NoError(t, json.Unmarshal([]byte(lines[4]), &ee))
	ee.Data = bytes.Replace(ee.Data, []byte(`"project_id"`), []byte(`"project_ID"`), 1)
	b, err := json.Marshal(ee)
	require.NoError(t, err)
	lines[4] = string(b)

	js := importTarget(t)
	rep, err := stream.ImportVerified(ctxT(t), js, stream.DefaultName, strings.NewReader(strings.Join(lines, "\n")), stream.ImportConfig{})
	require.NoError(t, err, "a bad file is a verdict, not an error")
	require.False(t, rep.OK)
	require.Equal(t, ee.Seq, rep.FirstBadSeq)
	s, err := js.Stream(ctxT(t), stream.DefaultName)
	require.NoError(t, err)
	require.Equal(t, ee.Seq-1, s.CachedInfo().State.LastSeq, "nothing from the bad entry on is imported")
}
