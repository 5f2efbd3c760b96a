// Package configcheck holds the checks library configs' Validate methods
// share, so each config lists its problems in the same words.
package configcheck

import "github.com/cgledger/cgledger/protocol"

// NonNegative adds a violation for a negative count, size or duration,
// which has no meaning where zero already means the default.
func NonNegative[T ~int | ~int32 | ~int64](vs *protocol.Violations, field string, v T) {
	if v < 0 {
		vs.Add(field, protocol.VInvalidValue, "must not be negative (zero means the default), got %v", v)
	}
}
