package ledger

import (
	"time"

	"github.com/cgledger/cgledger/protocol"
)

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass, and so
// do the negative values documented as "none" (DeadlineGrace,
// ApprovalLease). Open calls it before it talks to JetStream.
func (c Config) Validate() error {
	var vs protocol.Violations
	if c.Version != "" && !protocol.ValidVersion(c.Version) {
		vs.Add("Version", protocol.VInvalidValue, "invalid protocol version %q", c.Version)
	}
	c.Streams.Check(&vs, "Streams.")
	nonNegative(&vs, "ReportLease", c.ReportLease)
	nonNegative(&vs, "ToolAckWait", c.ToolAckWait)
	nonNegative(&vs, "Retention", c.Retention)
	if c.Retention > 0 && c.Retention < time.Second {
		vs.Add("Retention", protocol.VInvalidValue, "%s is below JetStream's 1s minimum TTL", c.Retention)
	}
	return protocol.BadRequest("ledger config", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass;
// ServeAPI calls it.
func (c APIConfig) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "RequestTimeout", c.RequestTimeout)
	nonNegative(&vs, "MaxInFlight", c.MaxInFlight)
	return protocol.BadRequest("ledger API config", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass;
// StartApprovalKeeper calls it.
func (c ApprovalKeeperConfig) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "AckWait", c.AckWait)
	nonNegative(&vs, "Workers", c.Workers)
	nonNegative(&vs, "FinishAfter", c.FinishAfter)
	return protocol.BadRequest("approval keeper config", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass;
// StartDeadlineKeeper calls it.
func (c DeadlineKeeperConfig) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "AckWait", c.AckWait)
	nonNegative(&vs, "Workers", c.Workers)
	return protocol.BadRequest("deadline keeper config", vs)
}

// nonNegative adds a violation for a negative count, size or duration,
// which has no meaning where zero already means the default.
func nonNegative[T ~int | ~int32 | ~int64](vs *protocol.Violations, field string, v T) {
	if v < 0 {
		vs.Add(field, protocol.VInvalidValue, "must not be negative (zero means the default), got %v", v)
	}
}
