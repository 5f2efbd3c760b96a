package stream_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// populate writes a small but varied ledger on a ledger of its own:
// roster, calls, reports, a duplicate and a rejection.
func populate(t *testing.T, calls int) *ledgertest.Env {
	t.Helper()
	e := ledgertest.New(t)
	ctx := ctxT(t)
	_, err := e.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "w"})
	require.NoError(t, err)
	call := func(i int) ledgertest.Call {
		return ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-x", ID: "call-" + string(rune('a'+i)), Epoch: 1, Tool: "search"}
	}
	for i := range calls {
		e.Complete(t, call(i), protocol.StatusSuccess, `{"n":1}`)
	}
	c := call(0)
	_, err = e.L.Report(ctx, c.Report(protocol.StatusSuccess))
	require.NoError(t, err)
	stale := c
	stale.Epoch = 9
	_, err = e.L.Report(ctx, stale.Report(protocol.StatusSuccess))
	require.ErrorIs(t, err, protocol.ErrStaleEpoch)
	return e
}

// exported writes a ledger of calls calls (populate) and exports it whole:
// the trailer, the file and its lines.
func exported(t *testing.T, calls int) (stream.ExportTrailer, []byte, []string) {
	t.Helper()
	e := populate(t, calls)
	var buf bytes.Buffer
	tr, err := e.L.Export(ctxT(t), &buf, 0)
	require.NoError(t, err)
	return tr, buf.Bytes(), strings.Split(strings.TrimSpace(buf.String()), "\n")
}

func TestExportVerifiesAndNamesTheEditedEntry(t *testing.T) {
	tr, file, lines := exported(t, 3)
	require.NotZero(t, tr.Count)

	rep, err := stream.VerifyExport(bytes.NewReader(file))
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.Equal(t, tr.Head, rep.Head)
	require.Equal(t, tr.Count, rep.Count)

	// Edit one entry's data (a report's status) and re-encode that line only.
	orig := append([]string(nil), lines...)
	target := 0
	for i, l := range lines {
		if strings.Contains(l, `"CG-Entry-Kind":["report"]`) {
			target = i
			break
		}
	}
	require.NotZero(t, target)
	var ee stream.ExportEntry
	require.NoError(t, json.Unmarshal([]byte(lines[target]), &ee))
	ee.Data = bytes.Replace(ee.Data, []byte(`"status":"success"`), []byte(`"status":"failed"`), 1)
	edited, err := json.Marshal(ee)
	require.NoError(t, err)
	lines[target] = string(edited)
	rep, err = stream.VerifyExport(strings.NewReader(strings.Join(lines, "\n")))
	require.NoError(t, err)
	require.False(t, rep.OK)
	require.Equal(t, ee.Seq, rep.FirstBadSeq)

	// A header change is caught too, and so is a truncated file.
	headerEdit := append([]string(nil), orig...)
	require.NoError(t, json.Unmarshal([]byte(orig[target-1]), &ee))
	ee.Headers[protocol.HeaderTime] = []string{"2001-01-01T00:00:00Z"}
	edited, err = json.Marshal(ee)
	require.NoError(t, err)
	headerEdit[target-1] = string(edited)
	rep, err = stream.VerifyExport(strings.NewReader(strings.Join(headerEdit, "\n")))
	require.NoError(t, err)
	require.Equal(t, ee.Seq, rep.FirstBadSeq)

	rep, err = stream.VerifyExport(strings.NewReader(strings.Join(orig[:len(orig)-1], "\n")))
	require.NoError(t, err)
	require.False(t, rep.OK)
	require.Contains(t, rep.Reason, "truncated")
}

func TestExportFromSequenceCarriesPrevLink(t *testing.T) {
	e := populate(t, 2)
	var full, tail bytes.Buffer
	_, err := e.L.Export(ctxT(t), &full, 0)
	require.NoError(t, err)
	tr, err := e.L.Export(ctxT(t), &tail, 5)
	require.NoError(t, err)
	rep, err := stream.VerifyExport(&tail)
	require.NoError(t, err)
	require.True(t, rep.OK, rep.Reason)
	require.EqualValues(t, 5, rep.FromSeq)
	// The partial export ends on the same head as the full one.
	fullRep, err := stream.VerifyExport(&full)
	require.NoError(t, err)
	require.Equal(t, fullRep.Head, tr.Head)
	require.Equal(t, fullRep.LastSeq, rep.LastSeq)
}

func TestChainCoversCanonicalHeadersOnly(t *testing.T) {
	h1 := nats.Header{"CG-Agent-Id": {"a"}, "Nats-Msg-Id": {"x"}}
	h2 := nats.Header{"cg-agent-id": {"a"}, "Nats-Msg-Id": {"y"}}
	l1 := protocol.NextLink(protocol.Genesis, 1, "s", h1, []byte("d"))
	require.Equal(t, l1, protocol.NextLink(protocol.Genesis, 1, "s", h2, []byte("d")), "header case and Nats-* headers do not matter")
	require.NotEqual(t, l1, protocol.NextLink(protocol.Genesis, 2, "s", h1, []byte("d")))
	require.NotEqual(t, l1, protocol.NextLink(protocol.Genesis, 1, "t", h1, []byte("d")))
	require.NotEqual(t, l1, protocol.NextLink(protocol.Genesis, 1, "s", nats.Header{"CG-Agent-Id": {"b"}}, []byte("d")))
	require.NotEqual(t, l1, protocol.NextLink(protocol.Genesis, 1, "s", h1, []byte("e")))
	require.NotEqual(t, l1, protocol.NextLink(l1, 1, "s", h1, []byte("d")))
}

// TestExportEntryKeepsBytesExactly: a payload is written as JSON only when
// it reads back as the same bytes, whichever encoder wrote the line.
func TestExportEntryKeepsBytesExactly(t *testing.T) {
	cases := map[string]struct {
		data     []byte
		readable bool
	}{
		"compact object":       {[]byte(`{"status":"success","n":[1,2]}`), true},
		"string":               {[]byte(`"x"`), true},
		"spaced object":        {[]byte(`{"a": 1}`), false},
		"html characters":      {[]byte(`{"a":"<b>&"}`), false},
		"line separator":       {[]byte("{\"a\":\"\u2028\"}"), false},
		"not json":             {[]byte("plain text"), false},
		"not utf-8":            {[]byte{'"', 0xff, '"'}, false},
		"null":                 {[]byte(`null`), false},
		"empty":                {[]byte{}, false},
		"escaped html in json": {[]byte(`{"a":"\u003c"}`), true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			e := stream.ExportEntry{Entry: protocol.Entry{Seq: 1, Subject: "s", Data: c.data}, Link: "l"}
			plain, err := json.Marshal(e) // escapes HTML
			require.NoError(t, err)
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			require.NoError(t, enc.Encode(e))
			for _, line := range [][]byte{plain, buf.Bytes()} {
				var fields map[string]json.RawMessage
				require.NoError(t, json.Unmarshal(line, &fields))
				_, asJSON := fields["json"]
				require.Equal(t, c.readable, asJSON, "%s", line)
				var back stream.ExportEntry
				require.NoError(t, json.Unmarshal(line, &back))
				require.Equal(t, string(c.data), string(back.Data), "%s", line)
			}
		})
	}
}

// TestExportWritesJSONAndReadsVersion1: entries' JSON payloads are JSON in
// the file, and a version 1 file (every payload base64) still verifies.
func TestExportWritesJSONAndReadsVersion1(t *testing.T) {
	_, file, lines := exported(t, 2)
	require.Contains(t, lines[0], `"version":2`)
	asJSON := 0
	for _, l := range lines[1 : len(lines)-1] {
		if strings.Contains(l, `"json":{`) {
			asJSON++
		}
	}
	require.Equal(t, len(lines)-2, asJSON, "every entry's payload is compact JSON here")

	// The same file as version 1 wrote it.
	v1 := []string{strings.Replace(lines[0], `"version":2`, `"version":1`, 1)}
	for _, l := range lines[1 : len(lines)-1] {
		var ee stream.ExportEntry
		require.NoError(t, json.Unmarshal([]byte(l), &ee))
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		delete(m, "json")
		m["data"] = ee.Data // []byte: base64
		b, err := json.Marshal(m)
		require.NoError(t, err)
		v1 = append(v1, string(b))
	}
	v1 = append(v1, lines[len(lines)-1])
	for _, file := range []string{string(file), strings.Join(v1, "\n")} {
		rep, err := stream.VerifyExport(strings.NewReader(file))
		require.NoError(t, err)
		require.True(t, rep.OK, rep.Reason)
	}
}

// TestExportReaderRefusesAmbiguousLines covers lines a person and the
// reader could read differently: a repeated key (the reader keeps the last
// copy, a person or another decoder may see the first), an entry marked as
// the trailer, a line that is neither, and a trailer naming another last
// sequence. A repeated key inside an entry's json payload is the stored
// bytes and stays readable.
func TestExportReaderRefusesAmbiguousLines(t *testing.T) {
	_, _, lines := exported(t, 2)
	require.Greater(t, len(lines), 4)
	with := func(i int, line string) string {
		l := append([]string(nil), lines...)
		l[i] = line
		return strings.Join(l, "\n")
	}
	entry := lines[2] // an entry line: {"seq":2,...}
	for name, tc := range map[string]struct{ file, want string }{
		"forged copy first": {with(2, strings.Replace(entry, `{"seq":2,`, `{"seq":2,"subject":"cg.forged",`, 1)), "line 3 repeats a key (line.subject)"},
		"repeated header":   {with(2, strings.Replace(entry, `"headers":{`, `"headers":{"CG-Time":["x"],`, 1)), "line 3 repeats a key"},
		"entry marked end":  {with(2, strings.Replace(entry, `{"seq":2,`, `{"end":true,"seq":2,`, 1)), `line 3 is an entry (seq 2) marked "end"`},
		"neither":           {with(2, `{"end":false}`), "line 3 is neither an entry"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := stream.VerifyExport(strings.NewReader(tc.file))
			require.ErrorIs(t, err, stream.ErrBadExport)
			require.ErrorContains(t, err, tc.want)
		})
	}
	t.Run("trailer names another last sequence", func(t *testing.T) {
		last := len(lines) - 1
		var tr stream.ExportTrailer
		require.NoError(t, json.Unmarshal([]byte(lines[last]), &tr))
		tr.LastSeq++
		b, err := json.Marshal(tr)
		require.NoError(t, err)
		rep, err := stream.VerifyExport(strings.NewReader(with(last, string(b))))
		require.NoError(t, err)
		require.False(t, rep.OK)
		require.Contains(t, rep.Reason, "trailer says")
	})
	t.Run("repeated key inside a json payload is the payload", func(t *testing.T) {
		var ee stream.ExportEntry
		require.NoError(t, json.Unmarshal([]byte(entry), &ee))
		ee.Data = []byte(`{"a":1,"a":2}`)
		b, err := json.Marshal(ee)
		require.NoError(t, err)
		require.Contains(t, string(b), `"json":{"a":1,"a":2}`)
		rep, err := stream.VerifyExport(strings.NewReader(with(2, string(b))))
		require.NoError(t, err, "the line reads; its link no longer matches")
		require.False(t, rep.OK)
		require.Equal(t, ee.Seq, rep.FirstBadSeq)
	})
}
