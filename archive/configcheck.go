package archive

import (
	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/protocol"
)

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration (a negative window, age or size), or nil. Zero values
// are the defaults and pass; New calls it. How SealAge compares with
// Retention is serve's settings check (archive_seal_age), and the stream
// names are the ledger's.
func (c Config) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "Retention", c.Retention)
	configcheck.NonNegative(&vs, "SealAge", c.SealAge)
	configcheck.NonNegative(&vs, "SegmentBytes", c.SegmentBytes)
	return protocol.BadRequest("archive config", vs)
}
