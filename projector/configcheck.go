package projector

import "github.com/cgledger/cgledger/protocol"

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass, and so
// does a negative TailSyncInterval (documented: fsync every tail batch);
// New calls it.
func (c Config) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "BatchSize", c.BatchSize)
	nonNegative(&vs, "SyncEvery", c.SyncEvery)
	nonNegative(&vs, "SkipPollInterval", c.SkipPollInterval)
	return protocol.BadRequest("projector config", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass;
// ServeAPI calls it.
func (c APIConfig) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "RequestTimeout", c.RequestTimeout)
	nonNegative(&vs, "MaxInFlight", c.MaxInFlight)
	nonNegative(&vs, "MaxWait", c.MaxWait)
	return protocol.BadRequest("projector API config", vs)
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the options, or nil. The zero value passes; OpenStore calls it.
func (o StoreOptions) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "CacheBytes", o.CacheBytes)
	return protocol.BadRequest("store options", vs)
}

// nonNegative adds a violation for a negative count, size or duration,
// which has no meaning where zero already means the default.
func nonNegative[T ~int | ~int64](vs *protocol.Violations, field string, v T) {
	if v < 0 {
		vs.Add(field, protocol.VInvalidValue, "must not be negative (zero means the default), got %v", v)
	}
}

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration, or nil. Zero values are the defaults and pass.
// NewWaitingCollector and NewApprovalsCollector return no error and do
// not call it; a caller that builds the config from input checks it.
func (c WaitingConfig) Validate() error {
	var vs protocol.Violations
	nonNegative(&vs, "Grace", c.Grace)
	nonNegative(&vs, "CacheFor", c.CacheFor)
	return protocol.BadRequest("waiting-call gauges config", vs)
}
