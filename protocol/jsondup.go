package protocol

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// maxDuplicateKeyViolations bounds the duplicate-key violations listed for
// one JSON document. A body of nothing but repeated keys could otherwise
// produce a reply and a rejection entry larger than one NATS message, and
// then the refusal could not be recorded at all.
const maxDuplicateKeyViolations = 100

// MaxJSONDepth bounds how deeply a request's JSON may nest. Deeper
// documents are refused: every reader of a stored card (the ledger's own
// encoder, clients in other languages) has a nesting limit, and a card one
// of them cannot read back is worse than a card refused up front.
const MaxJSONDepth = 256

// dupFrame is one open JSON container while scanning for duplicate keys.
type dupFrame struct {
	// seen counts the member names of an object; nil for an array.
	seen map[string]int
	// elem is this container's path element in its parent: ".name" or
	// "[i]", empty for the root. Paths are built only when reporting, so
	// deep nesting costs linear, not quadratic, memory.
	elem string
	// key is the object member whose value comes next ("" while a member
	// name is expected); index is an array's next element index.
	key     string
	haveKey bool
	index   int
}

// CheckDuplicateKeys records a VDuplicate violation for every key that
// appears more than once in the same JSON object of data, at any depth.
// encoding/json silently keeps the last copy, while other decoders keep the
// first: the ledger and a client could then read different requests from
// the same bytes. data must already be known to be valid JSON. Members of
// the root object named in opaque are not examined: the caller checks them
// on their own, under their own prefix (a dispatch's card and payload).
func CheckDuplicateKeys(prefix string, data []byte, vs *Violations, opaque ...string) {
	if noDuplicateKeys(data) {
		return
	}
	checkDuplicateKeysExact(prefix, data, vs, opaque...)
}

// checkDuplicateKeysExact is checkDuplicateKeys without the fast scan: it
// walks every token and names every violation.
func checkDuplicateKeysExact(prefix string, data []byte, vs *Violations, opaque ...string) {
	dec := json.NewDecoder(bytes.NewReader(data))
	// Numbers are irrelevant here; json.Number avoids float conversions
	// failing on numbers such as 1e999 that valid JSON allows.
	dec.UseNumber()
	var stack []*dupFrame
	found := 0
	skip := 0 // depth inside an opaque member's value
	// path renders the current path, keeping only its last
	// MaxViolationText bytes: a document can nest keys as long as itself.
	// A path that does not fit is "..." and its end, as Violations.Add
	// clips a field (docs/protocol.md, Limits), built from the frames that
	// fit without building the whole path.
	path := func() string {
		n, first := 0, 0
		for i := len(stack) - 1; i >= 0; i-- {
			if n += len(stack[i].elem); n > MaxViolationText {
				first = i
				break
			}
		}
		var b strings.Builder
		if n <= MaxViolationText {
			b.WriteString(prefix)
		}
		for _, f := range stack[first:] {
			b.WriteString(f.elem)
		}
		return clipTail(b.String(), MaxViolationText)
	}
	// valueDone is called after a complete value inside the top frame.
	valueDone := func() {
		if len(stack) == 0 {
			return
		}
		top := stack[len(stack)-1]
		if top.seen != nil {
			top.key, top.haveKey = "", false
		} else {
			top.index++
		}
	}
	// childElem is the path element of the value that comes next.
	childElem := func() string {
		if len(stack) == 0 {
			return ""
		}
		top := stack[len(stack)-1]
		if top.seen != nil {
			return "." + top.key
		}
		return "[" + strconv.Itoa(top.index) + "]"
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			// io.EOF at the end; any other error cannot happen on valid
			// JSON, and the caller reports invalid JSON itself.
			return
		}
		if skip > 0 {
			if d, ok := tok.(json.Delim); ok {
				switch d {
				case '{', '[':
					skip++
				default:
					skip--
					if skip == 0 {
						valueDone()
					}
				}
			}
			continue
		}
		top := (*dupFrame)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		// A member name inside an object.
		if top != nil && top.seen != nil && !top.haveKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				valueDone()
				continue
			}
			key, _ := tok.(string)
			top.seen[key]++
			if top.seen[key] == 2 {
				if found == maxDuplicateKeyViolations {
					vs.Add(prefix, VDuplicate, "more duplicate keys follow; only the first %d are listed", maxDuplicateKeyViolations)
					return
				}
				found++
				where := path()
				vs.Add(where+"."+key, VDuplicate, "key %s appears more than once in %s; JSON object keys must be unique", strconv.Quote(Clip(key)), clipTail(where, 200))
			}
			top.key, top.haveKey = key, true
			if len(stack) == 1 && slices.Contains(opaque, key) {
				// Consume the member's value without looking into it.
				tok, err = dec.Token()
				if err != nil {
					return
				}
				if d, ok := tok.(json.Delim); ok && (d == '{' || d == '[') {
					skip = 1
				} else {
					valueDone()
				}
			}
			continue
		}
		d, isDelim := tok.(json.Delim)
		if isDelim && (d == '{' || d == '[') && len(stack) >= MaxJSONDepth {
			vs.Add(path(), VTooLarge, "nests deeper than %d levels", MaxJSONDepth)
			return
		}
		switch {
		case isDelim && d == '{':
			stack = append(stack, &dupFrame{seen: map[string]int{}, elem: childElem()})
		case isDelim && d == '[':
			stack = append(stack, &dupFrame{elem: childElem()})
		case isDelim: // ']' (a '}' is handled with member names above)
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}
