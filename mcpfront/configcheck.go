package mcpfront

import (
	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/protocol"
)

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration (a negative bound or interval), or nil. Zero values are
// the defaults and pass.
func (c HTTPConfig) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "ProgressInterval", c.ProgressInterval)
	configcheck.NonNegative(&vs, "CloseStreamAfter", c.CloseStreamAfter)
	configcheck.NonNegative(&vs, "MaxMessageBytes", c.MaxMessageBytes)
	configcheck.NonNegative(&vs, "SessionTimeout", c.SessionTimeout)
	return protocol.BadRequest("MCP front door HTTP config", vs)
}
