package stream

import (
	"encoding/base64"
	"slices"
	"strconv"
	"time"

	"github.com/cgledger/cgledger/internal/jsonenc"
)

// AppendExportLine appends e's entry line, without the newline, exactly as
// json.Marshal(e) writes it. Exports and the archive write every entry of
// the ledger this way: encoding/json's reflection, and the compaction it
// runs again over a Marshaler's output, were most of an export's CPU, and
// the archive writes beside the hot path. exportline_internal_test.go checks the
// bytes against json.Marshal over generated entries.
func AppendExportLine(b []byte, e ExportEntry) ([]byte, error) {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, `,"subject":`...)
	b = jsonenc.AppendString(b, e.Subject)
	if len(e.Headers) > 0 {
		b = append(b, `,"headers":{`...)
		keys := make([]string, 0, 16)
		for k := range e.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonenc.AppendString(b, k)
			b = append(b, ':')
			vs := e.Headers[k]
			if vs == nil {
				b = append(b, "null"...)
				continue
			}
			b = append(b, '[')
			for j, v := range vs {
				if j > 0 {
					b = append(b, ',')
				}
				b = jsonenc.AppendString(b, v)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	if readableJSON(e.Data) {
		b = append(b, `,"json":`...)
		b = append(b, e.Data...)
	} else {
		b = append(b, `,"data":"`...)
		b = base64.StdEncoding.AppendEncode(b, e.Data)
		b = append(b, '"')
	}
	b = append(b, `,"time":`...)
	if y := e.Time.Year(); e.Time.Location() != time.UTC || y < 0 || y > 9999 {
		t, err := e.Time.MarshalJSON()
		if err != nil {
			return b, err
		}
		b = append(b, t...)
	} else {
		b = append(b, '"')
		b = e.Time.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	b = append(b, `,"link":`...)
	b = jsonenc.AppendString(b, e.Link)
	return append(b, '}'), nil
}
