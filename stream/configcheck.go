package stream

import (
	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/protocol"
)

// Validate returns a bad_request *protocol.Error listing every problem of
// the stream configuration, or nil. Zero values are the defaults and pass.
func (c Config) Validate() error {
	var vs protocol.Violations
	c.Check(&vs, "")
	return protocol.BadRequest("stream config", vs)
}

// Check adds every problem of the stream configuration to vs, each field
// named with prefix: a config that embeds one (ledger.Config.Streams)
// lists its problems with its own.
func (c Config) Check(vs *protocol.Violations, prefix string) {
	configcheck.NonNegative(vs, prefix+"Replicas", c.Replicas)
	configcheck.NonNegative(vs, prefix+"DuplicateWindow", c.DuplicateWindow)
	configcheck.NonNegative(vs, prefix+"MaxMsgSize", c.MaxMsgSize)
	configcheck.NonNegative(vs, prefix+"MaxBytes", c.MaxBytes)
	configcheck.NonNegative(vs, prefix+"MaxAge", c.MaxAge)
	configcheck.NonNegative(vs, prefix+"CallRecordTTL", c.CallRecordTTL)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the import configuration, or nil. The zero value passes; ImportVerified
// calls it before it reads anything.
func (c ImportConfig) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "InFlight", c.InFlight)
	return protocol.BadRequest("import config", vs)
}
