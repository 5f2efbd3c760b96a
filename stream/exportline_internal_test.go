package stream

import (
	"encoding/json"
	"math/rand/v2"
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
	}
}
