package conformance

import (
	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/protocol"
)

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration (a negative grace or settle time), or nil. Zero values
// are the defaults and pass; Run calls it, and checks the run id and the
// case names, which need the defaults and the case list, itself.
func (c Config) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "Grace", c.Grace)
	configcheck.NonNegative(&vs, "Settle", c.Settle)
	return protocol.BadRequest("conformance config", vs)
}
