package natsserver

import (
	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/protocol"
)

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration (no StoreDir, a port outside 0 to 65535, a negative
// interval, size or timeout), or nil. Zero values are the defaults and
// pass, except StoreDir, which is required; Start calls it.
func (c Config) Validate() error {
	var vs protocol.Violations
	if c.StoreDir == "" {
		vs.Add("StoreDir", protocol.VInvalidValue, "is required")
	}
	if c.Port < 0 || c.Port > 65535 {
		vs.Add("Port", protocol.VInvalidValue, "must be from 0 (a random free port) to 65535, got %d", c.Port)
	}
	configcheck.NonNegative(&vs, "SyncInterval", c.SyncInterval)
	configcheck.NonNegative(&vs, "MaxStore", c.MaxStore)
	configcheck.NonNegative(&vs, "ReadyTimeout", c.ReadyTimeout)
	return protocol.BadRequest("embedded server config", vs)
}
