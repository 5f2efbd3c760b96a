package protocol

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// ResultCardCertain says whether a typed tool.result card is certainly one
// DecodeCardStored accepts over its JSON encoding and reads back unchanged,
// without decoding it: every field one the decoder accepts, and content
// exactly {"status":S,"result":R} (no error; S a status that needs none), R
// already in the stored form (compact, <, >, &, U+2028 and U+2029
// escaped), valid UTF-8, the card within MaxCardBytes and without a
// repeated key at any depth. It returns the card's stored form and the
// content's status. Any other card (false) is left to the decoder, which
// names every violation: a typed writer then keeps the wire's answer.
func ResultCardCertain(c *Card) (stored []byte, status string, ok bool) {
	if c.Type != CardToolResult || !ValidIdentifier(c.CardID) || !ValidIdentifier(c.ProjectID) ||
		!ValidIdentifier(c.AgentTurnID) || !ValidIdentifier(c.ToolCallID) ||
		!ValidName(c.AuthorID) || !ValidName(c.FunctionName) ||
		!utf8.ValidString(c.Metadata.TraceID) || !utf8.ValidString(c.Metadata.ParentStepID) || !utf8.ValidString(c.Metadata.StepID) {
		return nil, "", false
	}
	status, result, ok := resultContentParts(c.Content)
	if !ok || !utf8.Valid(result) || !json.Valid(result) || !storedForm(result) {
		return nil, "", false
	}
	b, err := json.Marshal(c)
	if err != nil || len(b) > MaxCardBytes || !noDuplicateKeys(b) {
		return nil, "", false
	}
	return b, status, true
}

// resultContentParts splits content of the form {"status":S,"result":R}
// (as encoding/json writes a ToolResultContent without an error) into S
// and R, for a status that may come without an error.
func resultContentParts(content []byte) (string, []byte, bool) {
	const head, mid = `{"status":"`, `","result":`
	if len(content) < len(head)+len(mid)+2 || !bytes.HasPrefix(content, []byte(head)) || content[len(content)-1] != '}' {
		return "", nil, false
	}
	rest := content[len(head) : len(content)-1]
	for _, s := range [...]string{StatusSuccess, StatusPartial, StatusCanceled} {
		if len(rest) > len(s)+len(mid) && string(rest[:len(s)]) == s && string(rest[len(s):len(s)+len(mid)]) == mid {
			return s, rest[len(s)+len(mid):], true
		}
	}
	return "", nil, false
}

// storedForm says whether valid JSON r is unchanged by the encodings a
// stored card's content goes through (json.Compact, then encoding/json's
// compaction with HTML escaping): no space outside strings, no <, > or &,
// no U+2028 or U+2029.
func storedForm(r []byte) bool {
	in, esc := false, false
	for i, c := range r {
		switch {
		case c == '<' || c == '>' || c == '&':
			return false
		case c == 0xE2 && i+2 < len(r) && r[i+1] == 0x80 && r[i+2]&^1 == 0xA8:
			return false
		case esc:
			esc = false
		case in && c == '\\':
			esc = true
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}
