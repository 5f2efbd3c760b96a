package mcpfront

import "github.com/cgledger/cgledger/protocol"

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration (a negative bound or interval), or nil. Zero values are
// the defaults and pass.
func (c HTTPConfig) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "ProgressInterval", c.ProgressInterval)
	nonNegative(&vs, "CloseStreamAfter", c.CloseStreamAfter)
	nonNegative(&vs, "MaxMessageBytes", c.MaxMessageBytes)
	nonNegative(&vs, "SessionTimeout", c.SessionTimeout)
	return protocol.BadRequest("MCP front door HTTP config", vs)
}

// nonNegative adds a violation for a negative size or duration, which has
// no meaning where zero already means the default.
func nonNegative[T ~int | ~int64](vs *protocol.Violations, field string, v T) {
	if v < 0 {
		vs.Add(field, protocol.VInvalidValue, "must not be negative (zero means the default), got %v", v)
	}
}
