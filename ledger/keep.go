package ledger

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// headerMsgTTL is JetStream's per-message TTL header. "never" keeps an
// entry past the stream's max age (nats-server 2.11 and later, on a stream
// with AllowMsgTTL). It is not chained: JetStream's own Nats-* headers
// steer the server and are not part of an entry's content.
const headerMsgTTL = "Nats-TTL"

// keepForever marks the entries a ledger keeps reading for as long as it
// lives, whatever the retention window (docs/durability.md): tool
// definitions and roster entries. Without the mark, a tool registered
// once, or an agent's worker target, would vanish from the write path once
// its entry aged out, while entries of single calls may expire with their
// call.
func (l *Ledger) keepForever(msg *nats.Msg) {
	if l.msgTTL {
		msg.Header.Set(headerMsgTTL, "never")
	}
}

// keptForever reports whether a stored entry carries the mark, or needs
// none because the stream has no per-message TTL.
func (l *Ledger) keptForever(h nats.Header) bool {
	return !l.msgTTL || h.Get(headerMsgTTL) == "never"
}

// enableMsgTTL turns on per-message TTLs on a ledger stream created before
// they were used (enabling changes nothing stored; nats-server refuses to
// turn them off again). A server too old for them leaves the stream as it
// is: entries are then not marked, and a retention window would let tool
// definitions and roster entries go (serve says so when retention is set).
func enableMsgTTL(ctx context.Context, s jetstream.Stream, js jetstream.JetStream, log *slog.Logger) bool {
	cfg := s.CachedInfo().Config
	if cfg.AllowMsgTTL {
		return true
	}
	cfg.AllowMsgTTL = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		log.Warn("ledger: the stream does not take per-message TTLs (nats-server before 2.11?); tool definitions and roster entries will not outlive a retention window", "stream", cfg.Name, "err", err)
		return false
	}
	log.Info("ledger: per-message TTLs enabled on the stream, so tool definitions and roster entries outlive any retention window", "stream", cfg.Name)
	return true
}

// KeepsDefinitions reports whether tool definitions and roster entries
// are written to outlive the stream's retention window.
func (l *Ledger) KeepsDefinitions() bool { return l.msgTTL }
