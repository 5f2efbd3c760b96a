package protocol

import "bytes"

// fastDupMaxKeys is the most member names the fast scan compares within one
// object (pairwise, so its cost stays small); a larger object goes to the
// exact scan.
const fastDupMaxKeys = 64

// noDuplicateKeys reports whether data, known to be valid JSON, certainly
// has no repeated key in any object and nests at most MaxJSONDepth deep.
// It scans the bytes once without allocating for ordinary documents, where
// checkDuplicateKeys' token decoder allocates per token: the ledger checks
// every command, card and report, and the projector every command again.
// It answers false whenever it is not sure (a repeated key, a name with an
// escape, which must be decoded to compare, a large object, deep nesting,
// anything unexpected); the caller then runs the exact scan, which names
// each violation. So it never changes a verdict, it only skips work.
func noDuplicateKeys(data []byte) bool {
	type frame struct {
		object  bool
		wantKey bool
		// first is the index in keys of this object's first member name.
		first int
	}
	var stackBuf [16]frame
	var keysBuf [32][]byte
	stack, keys := stackBuf[:0], keysBuf[:0]
	for i := 0; i < len(data); i++ {
		switch c := data[i]; c {
		case ' ', '\t', '\n', '\r', ':':
		case '{', '[':
			if len(stack) >= MaxJSONDepth {
				return false
			}
			stack = append(stack, frame{object: c == '{', wantKey: c == '{', first: len(keys)})
		case '}', ']':
			if len(stack) == 0 {
				return false
			}
			top := stack[len(stack)-1]
			if top.object != (c == '}') {
				return false
			}
			keys = keys[:top.first]
			stack = stack[:len(stack)-1]
		case ',':
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].wantKey = true
			}
		case '"':
			start := i + 1
			escaped := false
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					escaped = true
					i++
				}
			}
			if i >= len(data) {
				return false
			}
			if len(stack) == 0 || !stack[len(stack)-1].object || !stack[len(stack)-1].wantKey {
				continue
			}
			top := &stack[len(stack)-1]
			top.wantKey = false
			if escaped || len(keys)-top.first >= fastDupMaxKeys {
				return false
			}
			name := data[start:i]
			for _, k := range keys[top.first:] {
				if bytes.Equal(k, name) {
					return false
				}
			}
			keys = append(keys, name)
		default:
			// A number, true, false or null: skip to the byte before the
			// next delimiter.
			for i+1 < len(data) && !isJSONDelimiter(data[i+1]) {
				i++
			}
		}
	}
	return len(stack) == 0
}

// isJSONDelimiter reports whether c ends a JSON literal or number.
func isJSONDelimiter(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\n', '\r', ':':
		return true
	}
	return false
}
