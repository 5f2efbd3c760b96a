package stream

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// TestAppendExportLineMatchesEncodingJSON checks the hand-written entry
// line against encoding/json's encoding of the same line, over entries with
// every kind of header, payload and time an export can hold.
func TestAppendExportLineMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 13))
	pieces := []string{"a", "Z", "9", "-", ".", "<", ">", "&", "\"", "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "é", "日本", "\u2028", "\u2029", "\xff", "\xc3", "😀", " "}
	str := func(max int) string {
		n := r.IntN(max + 1)
		s := ""
		for range n {
			if r.IntN(3) == 0 {
				s += pieces[r.IntN(len(pieces))]
			} else {
				s += string(rune('a' + r.IntN(26)))
			}
		}
		return s
	}
	payloads := [][]byte{nil, {}, []byte("null"), []byte(`{"a":1}`), []byte(`{"a": 1}`), []byte(`[1,2,3]`), []byte(`"x<y"`),
		[]byte(`{"s":"\u2028"}`), []byte("\xff\xfe"), []byte("plain text"), []byte(`{"n":1.5e3,"t":true,"z":null}`), []byte(`  {}`), []byte(`{"k":"é"}`)}
	zones := []*time.Location{time.UTC, time.FixedZone("X", 3600), time.FixedZone("Y", -5*3600-1800)}
	var lines [][]byte
	for i := range 20000 {
		e := ExportEntry{Entry: protocol.Entry{Seq: r.Uint64() >> uint(r.IntN(64)), Subject: str(30)}, Link: str(70)}
		if r.IntN(4) > 0 {
			e.Headers = map[string][]string{}
			for range r.IntN(6) {
				var vs []string
				switch r.IntN(5) {
				case 0: // nil: encoded as null
				case 1:
					vs = []string{}
				default:
					for range 1 + r.IntN(3) {
						vs = append(vs, str(20))
					}
				}
				e.Headers[str(12)] = vs
			}
		}
		if r.IntN(3) == 0 {
			e.Data = []byte(str(40))
		} else {
			e.Data = payloads[r.IntN(len(payloads))]
		}
		e.Time = time.Unix(r.Int64N(1<<35)-1<<34, r.Int64N(1e9)).In(zones[r.IntN(len(zones))])
		switch i % 1000 {
		case 0:
			e.Time = time.Time{}
		case 1:
			e.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) // refused by both
		case 2:
			e.Time = time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)
		}
		want, werr := json.Marshal(lineOf(e))
		got, gerr := AppendExportLine(nil, e)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("entry %d: errors differ: encoding/json %v, hand-written %v", i, werr, gerr)
		}
		if werr == nil && string(got) != string(want) {
			t.Fatalf("entry %d differs:\n got %s\nwant %s", i, got, want)
		}
		if werr == nil {
			lines = append(lines, got)
		}
	}
	checkReadExportLine(t, r, lines)
}

// checkReadExportLine checks the hand-written line reader against
// encoding/json over lines and over damaged copies of them (bytes changed,
// cut, or whitespace put in): whenever it takes a line, encoding/json
// reads the line without error into the same entry.
func checkReadExportLine(t *testing.T, r *rand.Rand, lines [][]byte) int {
	t.Helper()
	viaJSON := func(b []byte) (ExportEntry, error) {
		var al anyLine
		var e ExportEntry
		if err := json.Unmarshal(b, &al); err != nil {
			return e, err
		}
		if al.End {
			return e, errors.New("end")
		}
		err := al.entry(&e)
		return e, err
	}
	fast, damaged := 0, 0
	check := func(i int, b []byte) bool {
		var got ExportEntry
		if !readExportLine(b, &got) {
			return false
		}
		// ReadExport skips the repeated-key scan for the lines read by hand.
		if err := lineKeysUnique(i, b); err != nil {
			t.Fatalf("line %d: the hand-written reader takes %q, which repeats a key: %v", i, b, err)
		}
		want, err := viaJSON(b)
		if err != nil {
			t.Fatalf("line %d: the hand-written reader takes %q, encoding/json refuses it: %v", i, b, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("line %d %q:\n got %#v\nwant %#v", i, b, got, want)
		}
		return true
	}
	marks := []byte{' ', '"', '\\', ',', ':', '{', '}', '[', ']', 'n', '0', '1', 'e', '-', 0x80, 0xff}
	for i, b := range lines {
		if check(i, b) {
			fast++
		}
		for range 5 {
			d := bytes.Clone(b)
			switch r.IntN(3) {
			case 0:
				d[r.IntN(len(d))] = marks[r.IntN(len(marks))]
			case 1:
				d = d[:r.IntN(len(d))]
			default:
				j := r.IntN(len(d))
				d = append(d[:j:j], append([]byte{' '}, d[j:]...)...)
			}
			if check(i, d) {
				damaged++
			}
		}
	}
	t.Logf("hand-written reader: %d of %d lines, %d damaged copies taken (each equal to encoding/json's)", fast, len(lines), damaged)
	return fast
}

// TestReadExportLineTakesTheLedgersLines checks that the hand-written
// reader takes lines as the ledger writes them (no escapes, UTC times,
// JSON and binary payloads), each read as encoding/json reads it.
func TestReadExportLineTakesTheLedgersLines(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	word := func(n int) string {
		b := make([]byte, 1+r.IntN(n))
		for i := range b {
			b[i] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.é"[r.IntN(64)]
		}
		return string(b)
	}
	payloads := [][]byte{[]byte(`{"a":1,"time":"x"}`), []byte(`[1,2,3]`), []byte(`{"n":1.5e3,"t":true,"z":null}`), []byte("\x00\x01binary"), []byte(`"s"`), []byte(`{"a":1,"a":{"b":2,"b":3}}`), nil}
	var lines [][]byte
	for range 2000 {
		e := ExportEntry{Entry: protocol.Entry{Seq: 1 + r.Uint64N(1<<40), Subject: "cg.v1." + word(20),
			Headers: map[string][]string{"CG-Kind": {word(10)}, "Nats-Msg-Id": {word(30)}, "CG-Multi": {word(5), word(5)}},
			Data:    payloads[r.IntN(len(payloads))], Time: time.Unix(r.Int64N(1<<33), r.Int64N(1e9)).UTC()}, Link: word(64)}
		b, err := AppendExportLine(nil, e)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, b)
	}
	if n := checkReadExportLine(t, r, lines); n != len(lines) {
		t.Fatalf("the hand-written reader took %d of %d lines as the ledger writes them", n, len(lines))
	}
}
