package jina

import (
	"fmt"

	"github.com/cgledger/cgledger/internal/configcheck"
	"github.com/cgledger/cgledger/protocol"
)

// Validate returns a bad_request *protocol.Error listing every problem of
// the configuration (an allowed host that names no host, a loopback port
// outside 1 to 65535, a negative response cap), or nil. Zero values are
// the defaults and pass; Register calls it. New, which returns no error,
// skips a host that names none and takes a cap of zero or less as the
// default. options.jina of each definition is CheckOptions' business.
func (c Config) Validate() error {
	var vs protocol.Violations
	for i, h := range c.AllowedHosts {
		if _, ok := parseHostRule(h); !ok {
			vs.Add(fmt.Sprintf("AllowedHosts[%d]", i), protocol.VInvalidValue, "must be a host name or IP literal, with an optional port, got %q", protocol.Clip(h))
		}
	}
	for i, p := range c.AllowLoopbackPorts {
		if p < 1 || p > 65535 {
			vs.Add(fmt.Sprintf("AllowLoopbackPorts[%d]", i), protocol.VInvalidValue, "must be from 1 to 65535, got %d", p)
		}
	}
	configcheck.NonNegative(&vs, "MaxResponseBytes", c.MaxResponseBytes)
	return protocol.BadRequest("jina config", vs)
}
