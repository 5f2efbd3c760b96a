package ledger

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
)

// JetStream error codes that say the server had no room for a write: not
// the request's fault, and answered the same way to every write until
// storage changes.
const (
	jsAccountResourcesExceeded = 10002 // account storage limit
	jsInsufficientResources    = 10023 // the server's storage limit
	jsStorageResourcesExceeded = 10047
	jsStreamStoreFailed        = 10077 // the store's own error, e.g. "no space left on device"
)

// ErrStorageRefused is wrapped by StorageFault: the server refused the last
// write for want of storage.
var ErrStorageRefused = errors.New("the last ledger write was refused for want of storage")

// storageFault remembers the last write the server refused for want of
// storage, until a later write goes through. Free space alone does not say
// whether a write would succeed (a server limit, a stream failed by an
// earlier write error): the writes themselves do.
type storageFault struct {
	err atomic.Pointer[error]
}

// note records the outcome of one write that reached the server.
func (f *storageFault) note(err error) {
	if err == nil {
		if f.err.Load() != nil {
			f.err.Store(nil)
		}
		return
	}
	if isStorageRefusal(err) {
		f.err.Store(&err)
	}
}

// isStorageRefusal reports a write refused because the server's storage is
// full or failed.
func isStorageRefusal(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsAccountResourcesExceeded, jsInsufficientResources, jsStorageResourcesExceeded, jsStreamStoreFailed:
			return true
		}
	}
	return strings.Contains(err.Error(), "no space left") || strings.Contains(err.Error(), "insufficient resources")
}

// StorageFault returns an error wrapping ErrStorageRefused while the last
// write that reached the server was refused for want of storage (JetStream
// 10023 insufficient resources, 10047, 10002, or a store error such as "no
// space left on device"), and nil once a write has gone through since.
// serve reports it on /readyz and cgledger_storage_degraded. Writes the
// write guard refused never reached the server and do not count.
func (l *Ledger) StorageFault() error {
	p := l.fault.err.Load()
	if p == nil {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrStorageRefused, *p)
}
