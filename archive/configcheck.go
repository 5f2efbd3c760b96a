package archive

import "github.com/cgledger/cgledger/protocol"

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration (a negative window, age or size), or nil. Zero values
// are the defaults and pass; New calls it. How SealAge compares with
// Retention is serve's settings check (archive_seal_age), and the stream
// names are the ledger's.
func (c Config) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "Retention", c.Retention)
	nonNegative(&vs, "SealAge", c.SealAge)
	nonNegative(&vs, "SegmentBytes", c.SegmentBytes)
	return protocol.BadRequest("archive config", vs)
}

// nonNegative adds a violation for a negative size or duration, which has
// no meaning where zero already means the default.
func nonNegative[T ~int | ~int64](vs *protocol.Violations, field string, v T) {
	if v < 0 {
		vs.Add(field, protocol.VInvalidValue, "must not be negative (zero means the default), got %v", v)
	}
}
