package protocol

import (
	"encoding/base64"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxIdentifierLen bounds every identifier (ids, targets, names) in bytes.
const MaxIdentifierLen = 256

// Unrouted is the reserved token used in place of a project or channel id on
// rejection entries whose request named no valid one. No identifier may equal it.
const Unrouted = "_"

// ValidIdentifier reports whether s can be used as an identifier: a single
// NATS subject token of printable ASCII (0x21-0x7e) with no '.', '*' or '>',
// 1 to MaxIdentifierLen bytes, and not the reserved token "_".
// internal/auth scopes credentials by the same tokens.
func ValidIdentifier(s string) bool {
	if len(s) == 0 || len(s) > MaxIdentifierLen || s == Unrouted {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x21 || c > 0x7e || c == '.' || c == '*' || c == '>' {
			return false
		}
	}
	return true
}

// CheckIdent adds a violation unless s is a valid identifier. Empty values are
// reported as required (when required) or empty.
func CheckIdent(vs *Violations, field, s string, required bool) {
	switch {
	case s == "" && required:
		vs.Add(field, VRequired, "is required")
	case s == "":
		return
	case !ValidIdentifier(s):
		vs.Add(field, VInvalidToken, "must be 1-%d printable ASCII characters without '.', '*', '>' or whitespace, and not %q (got %s)", MaxIdentifierLen, Unrouted, strconv.Quote(Clip(s)))
	}
}

// KeyToken encodes an identifier into a KV-key-safe token.
func KeyToken(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// Clip shortens s for use in a message.
func Clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// ValidName reports whether s can be used as a free-form name (author_id,
// source id, function and tool names): 1 to MaxIdentifierLen bytes of valid
// UTF-8 with no control characters or whitespace. Unlike identifiers, names
// never appear in subjects, so they may contain '.', as in "tool.example".
func ValidName(s string) bool {
	if s == "" || len(s) > MaxIdentifierLen || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// CheckName adds a violation unless s is a valid name.
func CheckName(vs *Violations, field, s string, required bool) {
	switch {
	case s == "" && required:
		vs.Add(field, VRequired, "is required")
	case s == "":
	case !ValidName(s):
		vs.Add(field, VInvalidValue, "must be 1-%d bytes of UTF-8 without whitespace or control characters (got %s)", MaxIdentifierLen, strconv.Quote(Clip(s)))
	}
}
