package stream

import "github.com/cgledger/cgledger/protocol"

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
	nonNegative(vs, prefix+"Replicas", c.Replicas)
	nonNegative(vs, prefix+"DuplicateWindow", c.DuplicateWindow)
	nonNegative(vs, prefix+"MaxMsgSize", c.MaxMsgSize)
	nonNegative(vs, prefix+"MaxBytes", c.MaxBytes)
	nonNegative(vs, prefix+"MaxAge", c.MaxAge)
	nonNegative(vs, prefix+"CallRecordTTL", c.CallRecordTTL)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the import configuration, or nil. The zero value passes; ImportVerified
// calls it before it reads anything.
func (c ImportConfig) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "InFlight", c.InFlight)
	return protocol.BadRequest("import config", vs)
}

// nonNegative adds a violation for a negative count, size or duration,
// which has no meaning where zero already means the default.
func nonNegative[T ~int | ~int32 | ~int64](vs *protocol.Violations, field string, v T) {
	if v < 0 {
		vs.Add(field, protocol.VInvalidValue, "must not be negative (zero means the default), got %v", v)
	}
}
