package stream_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/protocol"
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

// syntheticExport is a full export file of n entries on subject, each with
// its chain link (the views are not involved: any subject chains).
func syntheticExport(t *testing.T, n int, subject string) []byte {
	t.Helper()
	hdr, err := json.Marshal(stream.ExportHeader{Format: stream.ExportFormat, Version: stream.ExportVersion, FromSeq: 1, PrevLink: protocol.Genesis.String()})
	require.NoError(t, err)
	b := append(hdr, '\n')
	head := protocol.Genesis
	for seq := uint64(1); seq <= uint64(n); seq++ {
		e := stream.ExportEntry{Entry: protocol.Entry{Seq: seq, Subject: subject, Headers: map[string][]string{"CG-Test": {"x"}}, Data: []byte(`{"n":1}`), Time: time.Unix(1, 0).UTC()}}
		head = protocol.NextLink(head, seq, subject, nats.Header(e.Headers), e.Data)
		e.Link = head.String()
		b, err = stream.AppendExportLine(b, e)
		require.NoError(t, err)
		b = append(b, '\n')
	}
	tr, err := json.Marshal(stream.ExportTrailer{End: true, Count: uint64(n), LastSeq: uint64(n), Head: head.String()})
	require.NoError(t, err)
	return append(b, tr...)
}

// TestImportVerifiedReturnsThePublishersError: the publishes run on a
// goroutine of their own; when JetStream refuses one, the import stops
// reading (the file is far longer than what the reader may run ahead) and
// returns the refusal, naming the entry, with nothing stored after it.
func TestImportVerifiedReturnsThePublishersError(t *testing.T) {
	js := importTarget(t)
	// An empty stream of another name: the entries' subjects land in the
	// ledger stream, so each publish's expected stream is wrong.
	_, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	file := syntheticExport(t, 20000, protocol.Root+".test.entry")
	verified := 0
	_, err = stream.ImportVerified(ctxT(t), js, "OTHER", bytes.NewReader(file), stream.ImportConfig{Verified: func(stream.ExportEntry) error {
		verified++
		return nil
	}})
	require.Error(t, err)
	require.Contains(t, err.Error(), "import: entry 1:")
	require.Less(t, verified, 20000, "the read stopped once the publisher failed")
	s, err := js.Stream(ctxT(t), stream.DefaultName)
	require.NoError(t, err)
	require.Zero(t, s.CachedInfo().State.LastSeq, "the ledger stream took none of them")
}

// TestImportVerifiedStoresALongFile: a file longer than the reader may run
// ahead of the publisher and than the window of acks is stored whole, every
// entry at its own sequence, and Progress counts every publish.
func TestImportVerifiedStoresALongFile(t *testing.T) {
	js := importTarget(t)
	const n = 5000
	file := syntheticExport(t, n, protocol.Root+".test.entry")
	var seen uint64
	rep, err := stream.ImportVerified(ctxT(t), js, stream.DefaultName, bytes.NewReader(file), stream.ImportConfig{InFlight: 64, Progress: func(c uint64) { seen = c }})
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.Equal(t, uint64(n), rep.Count)
	require.Equal(t, uint64(n), seen)
	s, err := js.Stream(ctxT(t), stream.DefaultName)
	require.NoError(t, err)
	require.Equal(t, uint64(n), s.CachedInfo().State.LastSeq)
}
