package protocol

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// JSONObject reads the fields of one JSON object for validation, recording a
// violation for every missing or mistyped field instead of stopping at the first.
type JSONObject struct {
	prefix string
	fields map[string]json.RawMessage
	vs     *Violations
}

// Size limits of the protocol (docs/protocol.md, "Limits"). They sit well
// under NATS's default max_payload (1 MiB, headers included), so an
// oversized request still reaches the ledger and is refused with a
// violation and a rejection entry instead of failing inside the client.
const (
	// MaxRequestBytes bounds the body of every API request (and of a tool
	// command an executor reads).
	MaxRequestBytes = 768 << 10
	// MaxHeaderBytes bounds the headers of a dispatch, a report or a tool
	// command, counted as on the wire: len(name)+len(value)+4 per value.
	MaxHeaderBytes = 16 << 10
	// MaxCardBytes bounds a card in its stored, normalized form. It leaves
	// room under the stream's default 1 MiB message size for the entry's
	// headers, and under MaxRequestBytes for the rest of a dispatch body.
	MaxCardBytes = 512 << 10
)

// ParseObject decodes data, a whole request document (an API body, a
// command payload, a card), as a JSON object. It records a violation and
// returns ok=false when data is too large, not UTF-8 or not a JSON object.
// A key repeated anywhere is recorded as a violation too, but ok stays true
// (the members read as encoding/json keeps them, the last copy): the caller
// checks the members as usual, so the refusal lists every problem, and
// refuses on the violations. Members of the root object named in opaque are
// not checked for repeated keys: the caller parses them as documents of
// their own.
func ParseObject(prefix string, data []byte, vs *Violations, opaque ...string) (JSONObject, bool) {
	if len(data) > MaxRequestBytes {
		vs.Add(prefix, VTooLarge, "is %d bytes; the limit is %d", len(data), MaxRequestBytes)
		return JSONObject{prefix: prefix, vs: vs}, false
	}
	o, ok := parseMember(prefix, data, vs)
	if !ok {
		return o, false
	}
	CheckDuplicateKeys(prefix, bytes.TrimSpace(data), vs, opaque...)
	return o, true
}

// parseMember decodes data as a JSON object without the document-level
// checks: for an object nested in a document parseObject already checked.
func parseMember(prefix string, data []byte, vs *Violations) (JSONObject, bool) {
	o := JSONObject{prefix: prefix, vs: vs}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		vs.Add(prefix, VRequired, "a JSON object is required")
		return o, false
	}
	// JSON text must be UTF-8 (RFC 8259); Go would carry invalid bytes
	// through into stored entries that strict parsers elsewhere reject.
	// Checked before the shape so that such a body is always named as such.
	if !utf8.Valid(trimmed) {
		vs.Add(prefix, VInvalidUTF8, "is not valid UTF-8")
		return o, false
	}
	if trimmed[0] != '{' {
		vs.Add(prefix, VInvalidType, "must be a JSON object")
		return o, false
	}
	if err := json.Unmarshal(trimmed, &o.fields); err != nil {
		// encoding/json gives up on nesting deeper than 10000 levels; such
		// a document is refused for its depth, at the path where it passes
		// MaxJSONDepth, like one nested 257 deep.
		if strings.Contains(err.Error(), "exceeded max depth") {
			n := len(*vs)
			checkDuplicateKeysExact(prefix, trimmed, vs)
			if len(*vs) > n {
				return o, false
			}
		}
		vs.Add(prefix, VInvalidJSON, "is not valid JSON: %v", err)
		return o, false
	}
	return o, true
}

// Path returns the field path of name.
func (o JSONObject) Path(name string) string {
	if o.prefix == "" {
		return name
	}
	return o.prefix + "." + name
}

// Has reports whether name is present (even as null).
func (o JSONObject) Has(name string) bool {
	_, ok := o.fields[name]
	return ok
}

// Raw returns the field's raw JSON, or nil when absent or null.
func (o JSONObject) Raw(name string) json.RawMessage {
	r, ok := o.fields[name]
	if !ok || isNull(r) {
		return nil
	}
	return r
}

// Str reads a string field. Absent and null count as absent.
func (o JSONObject) Str(name string, required bool) string {
	r := o.Raw(name)
	if r == nil {
		if required {
			o.vs.Add(o.Path(name), VRequired, "is required")
		}
		return ""
	}
	var s string
	if err := json.Unmarshal(r, &s); err != nil {
		o.vs.Add(o.Path(name), VInvalidType, "must be a string")
		return ""
	}
	if s == "" && required {
		o.vs.Add(o.Path(name), VEmpty, "must not be empty")
	}
	return s
}

// Ident reads a string field that must be a valid identifier.
func (o JSONObject) Ident(name string, required bool) string {
	s := o.Str(name, required)
	if s != "" && !ValidIdentifier(s) {
		CheckIdent(o.vs, o.Path(name), s, required)
		return ""
	}
	return s
}

// Name reads a string field that must be a valid name.
func (o JSONObject) Name(field string, required bool) string {
	s := o.Str(field, required)
	if s != "" && !ValidName(s) {
		CheckName(o.vs, o.Path(field), s, required)
		return ""
	}
	return s
}

// Object reads a field that must be a JSON object.
func (o JSONObject) Object(name string, required bool) (JSONObject, bool) {
	r := o.Raw(name)
	if r == nil {
		if required {
			o.vs.Add(o.Path(name), VRequired, "is required")
		}
		return JSONObject{}, false
	}
	if r[0] != '{' {
		o.vs.Add(o.Path(name), VInvalidType, "must be a JSON object")
		return JSONObject{}, false
	}
	return parseMember(o.Path(name), r, o.vs)
}

// Epoch reads a turn epoch given as a JSON number or a decimal string.
func (o JSONObject) Epoch(name string) (uint64, bool) {
	r := o.Raw(name)
	if r == nil {
		return 0, false
	}
	var s string
	if r[0] == '"' {
		if err := json.Unmarshal(r, &s); err != nil {
			o.vs.Add(o.Path(name), VInvalidType, "must be an unsigned integer")
			return 0, false
		}
	} else {
		s = string(r)
	}
	n, ok := ParseEpoch(s)
	if !ok {
		o.vs.Add(o.Path(name), VInvalidValue, "must be an unsigned decimal integer (got %s)", strconv.Quote(Clip(s)))
		return 0, false
	}
	return n, true
}

func isNull(r json.RawMessage) bool {
	return len(r) == 0 || string(bytes.TrimSpace(r)) == "null"
}

// CompactJSON returns r without insignificant whitespace, so stored bytes and
// fingerprints do not depend on how a client formatted its JSON.
func CompactJSON(r json.RawMessage) json.RawMessage {
	if r == nil {
		return nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, r); err != nil {
		return r
	}
	return b.Bytes()
}
