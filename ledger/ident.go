package ledger

import (
	"encoding/base64"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/cgledger/cgledger/internal/auth"
)

// MaxIdentifierLen bounds every identifier (ids, targets, names) in bytes.
const MaxIdentifierLen = 256

// Unrouted is the reserved token used in place of a project or channel id on
// rejection entries whose request named no valid one. No identifier may equal it.
const Unrouted = "_"

// ValidIdentifier reports whether s can be used as an identifier: a single
// NATS subject token of printable ASCII (0x21-0x7e) with no '.', '*' or '>',
// 1 to MaxIdentifierLen bytes, and not the reserved token "_".
// The grammar lives in internal/auth, which scopes credentials by the same
// tokens.
func ValidIdentifier(s string) bool { return auth.IsIdent(s) }

// checkIdent adds a violation unless s is a valid identifier. Empty values are
// reported as required (when required) or empty.
func checkIdent(vs *Violations, field, s string, required bool) {
	switch {
	case s == "" && required:
		vs.Add(field, VRequired, "is required")
	case s == "":
		return
	case !ValidIdentifier(s):
		vs.Add(field, VInvalidToken, "must be 1-%d printable ASCII characters without '.', '*', '>' or whitespace, and not %q (got %s)", MaxIdentifierLen, Unrouted, strconv.Quote(clip(s)))
	}
}

// keyToken encodes an identifier into a KV-key-safe token.
func keyToken(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// clip shortens s for use in a message.
func clip(s string) string {
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

// checkName adds a violation unless s is a valid name.
func checkName(vs *Violations, field, s string, required bool) {
	switch {
	case s == "" && required:
		vs.Add(field, VRequired, "is required")
	case s == "":
	case !ValidName(s):
		vs.Add(field, VInvalidValue, "must be 1-%d bytes of UTF-8 without whitespace or control characters (got %s)", MaxIdentifierLen, strconv.Quote(clip(s)))
	}
}
