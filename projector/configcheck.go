package projector

import (
	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/protocol"
)

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass, and so
// does a negative TailSyncInterval (documented: fsync every tail batch)
// and a negative FollowLinger (commit every tail batch at once);
// New calls it.
func (c Config) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "BatchSize", c.BatchSize)
	configcheck.NonNegative(&vs, "SyncEvery", c.SyncEvery)
	configcheck.NonNegative(&vs, "SkipPollInterval", c.SkipPollInterval)
	return protocol.BadRequest("projector config", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass;
// ServeAPI calls it.
func (c APIConfig) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "RequestTimeout", c.RequestTimeout)
	configcheck.NonNegative(&vs, "MaxInFlight", c.MaxInFlight)
	configcheck.NonNegative(&vs, "MaxWait", c.MaxWait)
	configcheck.NonNegative(&vs, "SnapshotTimeout", c.SnapshotTimeout)
	return protocol.BadRequest("projector API config", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the options, or nil. The zero value passes; OpenStore calls it.
func (o StoreOptions) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "CacheBytes", o.CacheBytes)
	return protocol.BadRequest("store options", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass.
// NewWaitingCollector and NewApprovalsCollector return no error and do
// not call it; a caller that builds the config from input checks it.
func (c WaitingConfig) Validate() error {
	var vs protocol.Violations
	configcheck.NonNegative(&vs, "Grace", c.Grace)
	configcheck.NonNegative(&vs, "CacheFor", c.CacheFor)
	return protocol.BadRequest("waiting-call gauges config", vs)
}
