// Package jsonenc writes the JSON the views and exports store by hand,
// byte for byte what encoding/json writes, for the values on their hot
// paths. It imports nothing of this module.
package jsonenc

import (
	"encoding/json"
	"unicode/utf8"
)

// AppendString appends s quoted as encoding/json quotes it. Plain printable
// ASCII (identifiers, subjects, states, links: nearly every string) is
// copied; any other string goes through encoding/json itself, which escapes
// HTML characters, control characters, U+2028/U+2029 and bad UTF-8.
func AppendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
