package natsserver

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
)

// StorageLog is a nats-server logger that passes the server's warnings and
// errors to a slog.Logger and remembers the first storage failure it
// reports. nats-server answers a failed write of a file-backed stream
// ("no space left on device", a read-only file system) by failing the
// stream for good, or by disabling JetStream; both need a restart once the
// disk is writable again, and its log is the only place that says so.
type StorageLog struct {
	Log    *slog.Logger
	failed atomic.Pointer[string]
}

// Failure returns the first storage failure the server logged, or "".
func (l *StorageLog) Failure() string {
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return ""
}

func (l *StorageLog) note(msg string) {
	for _, s := range []string{"no space left", "read-only file system", "ilesystem permission denied", "ile system permission denied", "critical write error", "will be DISABLED"} {
		if strings.Contains(msg, s) {
			l.failed.CompareAndSwap(nil, &msg)
			return
		}
	}
}

// Noticef drops the server's notices: serve logs its own.
func (l *StorageLog) Noticef(string, ...any) {}

// Warnf logs a server warning.
func (l *StorageLog) Warnf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.note(msg)
	l.Log.Warn("nats-server: " + msg)
}

// Fatalf logs a fatal server error; nats-server exits after it.
func (l *StorageLog) Fatalf(format string, v ...any) {
	l.Log.Error("nats-server: " + fmt.Sprintf(format, v...))
}

// Errorf logs a server error.
func (l *StorageLog) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.note(msg)
	l.Log.Error("nats-server: " + msg)
}

// Debugf drops the server's debug output.
func (l *StorageLog) Debugf(string, ...any) {}

// Tracef drops the server's trace output.
func (l *StorageLog) Tracef(string, ...any) {}
