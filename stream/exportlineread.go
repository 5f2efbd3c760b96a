package stream

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// readExportLine decodes an entry line laid out exactly as
// AppendExportLine writes it (keys in its order, no whitespace outside the
// payload, strings without escapes) into e, and reports whether it did.
// Any other line, valid or not, is left to encoding/json (ok false), so
// what a line decodes to, or why it is refused, never depends on the
// path: a replay decodes every line of a file, and encoding/json's
// reflection was more of its CPU than projecting the entry.
// exportline_internal_test.go checks it against encoding/json.
func readExportLine(b []byte, e *ExportEntry) bool {
	r := lineReader{b: b}
	if !r.lit(`{"seq":`) {
		return false
	}
	seq, ok := r.uint()
	if !ok || seq == 0 || !r.lit(`,"subject":`) {
		return false
	}
	subject, ok := r.str()
	if !ok {
		return false
	}
	var headers map[string][]string
	if r.lit(`,"headers":{`) {
		headers = map[string][]string{}
		for first := true; !r.lit("}"); first = false {
			if !first && !r.lit(",") {
				return false
			}
			k, ok := r.str()
			if !ok || !r.lit(":") {
				return false
			}
			if _, dup := headers[k]; dup {
				return false
			}
			if r.lit("null") {
				headers[k] = nil
				continue
			}
			if !r.lit("[") {
				return false
			}
			vs := []string{}
			for vfirst := true; !r.lit("]"); vfirst = false {
				if !vfirst && !r.lit(",") {
					return false
				}
				v, ok := r.str()
				if !ok {
					return false
				}
				vs = append(vs, v)
			}
			headers[k] = vs
		}
	}
	var data []byte
	switch {
	case r.lit(`,"json":`):
		// The payload runs to the `,"time":` that follows it; it must be
		// valid JSON and must not be null (encoding/json leaves a
		// RawMessage holding null, which the line reader then ignores).
		i := bytes.LastIndex(r.b, []byte(`,"time":`))
		if i < r.i {
			return false
		}
		raw := r.b[r.i:i]
		if len(raw) == 0 || string(raw) == "null" || !json.Valid(raw) || !compactEnds(raw) {
			return false
		}
		data = bytes.Clone(raw)
		r.i = i
	case r.lit(`,"data":`):
		s, ok := r.str()
		if !ok {
			return false
		}
		data = make([]byte, base64.StdEncoding.DecodedLen(len(s)))
		n, err := base64.StdEncoding.Decode(data, []byte(s))
		if err != nil {
			return false
		}
		data = data[:n]
	default:
		return false
	}
	if !r.lit(`,"time":`) {
		return false
	}
	start := r.i
	if _, ok := r.str(); !ok {
		return false
	}
	*e = ExportEntry{}
	if err := e.Time.UnmarshalJSON(r.b[start:r.i]); err != nil {
		return false
	}
	if !r.lit(`,"link":`) {
		return false
	}
	link, ok := r.str()
	if !ok || !r.lit("}") || r.i != len(r.b) {
		return false
	}
	e.Seq, e.Subject, e.Headers, e.Data, e.Link = seq, subject, headers, data, link
	return true
}

// compactEnds reports whether raw neither starts nor ends with whitespace:
// encoding/json would keep inner whitespace in a RawMessage but not the
// whitespace around the value.
func compactEnds(raw []byte) bool {
	ws := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	return !ws(raw[0]) && !ws(raw[len(raw)-1])
}

// lineReader walks an entry line.
type lineReader struct {
	b []byte
	i int
}

// lit consumes s if the line continues with it.
func (r *lineReader) lit(s string) bool {
	if len(r.b)-r.i < len(s) || string(r.b[r.i:r.i+len(s)]) != s {
		return false
	}
	r.i += len(s)
	return true
}

// uint consumes a JSON number that is a uint64 written without sign,
// fraction, exponent or leading zero.
func (r *lineReader) uint() (uint64, bool) {
	j := r.i
	for j < len(r.b) && r.b[j] >= '0' && r.b[j] <= '9' {
		j++
	}
	if j == r.i || (r.b[r.i] == '0' && j-r.i > 1) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(r.b[r.i:j]), 10, 64)
	if err != nil {
		return 0, false
	}
	r.i = j
	return n, true
}

// str consumes a JSON string without escapes whose bytes are valid UTF-8
// and no control character: encoding/json reads it as those bytes.
func (r *lineReader) str() (string, bool) {
	if r.i >= len(r.b) || r.b[r.i] != '"' {
		return "", false
	}
	ascii := true
	for j := r.i + 1; j < len(r.b); j++ {
		c := r.b[j]
		switch {
		case c == '"':
			s := r.b[r.i+1 : j]
			if !ascii && !utf8.Valid(s) {
				return "", false
			}
			r.i = j + 1
			return string(s), true
		case c == '\\' || c < 0x20:
			return "", false
		case c >= 0x80:
			ascii = false
		}
	}
	return "", false
}
