package ledger

import (
	"time"

	"github.com/cgledger/cgledger/internal/configcheck"
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
	configcheck.NonNegative(&vs, "ReportLease", c.ReportLease)
	configcheck.NonNegative(&vs, "ToolAckWait", c.ToolAckWait)
	configcheck.NonNegative(&vs, "Retention", c.Retention)
	switch c.ResultWrites {
	case ResultWritesAuto, ResultWritesBatch, ResultWritesSequential:
	default:
		vs.Add("ResultWrites", protocol.VInvalidValue, "must be %q, %q or empty (auto), got %q", ResultWritesBatch, ResultWritesSequential, c.ResultWrites)
	}
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
	configcheck.NonNegative(&vs, "RequestTimeout", c.RequestTimeout)
	configcheck.NonNegative(&vs, "MaxInFlight", c.MaxInFlight)
	return protocol.BadRequest("ledger API config", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass;
// StartApprovalKeeper calls it.
func (c ApprovalKeeperConfig) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "AckWait", c.AckWait)
	configcheck.NonNegative(&vs, "Workers", c.Workers)
	configcheck.NonNegative(&vs, "FinishAfter", c.FinishAfter)
	return protocol.BadRequest("approval keeper config", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass;
// StartDeadlineKeeper calls it.
func (c DeadlineKeeperConfig) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "AckWait", c.AckWait)
	configcheck.NonNegative(&vs, "Workers", c.Workers)
	return protocol.BadRequest("deadline keeper config", vs)
}
