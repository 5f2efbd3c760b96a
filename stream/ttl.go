package stream

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// HeaderMsgTTL is JetStream's per-message TTL header (nats-server 2.11 and
// later, on a stream with AllowMsgTTL). It is not chained: JetStream's own
// Nats-* headers steer the server and are not part of an entry's content.
const HeaderMsgTTL = "Nats-TTL"

// KeptForever reports whether entries of kind never expire, whatever the
// retention window: tool definitions, roster entries and skip entries. The
// ledger keeps reading them for as long as it lives (a tool registered once
// stays callable, an agent keeps its worker target, a skip keeps the
// projector going); entries of single calls may expire with their call.
func KeptForever(kind protocol.EntryKind) bool {
	return kind == protocol.KindTool || kind == protocol.KindRoster || kind == protocol.KindSkip
}

// TTL is the Nats-TTL of entries written under a retention window: whole
// seconds, at least one (JetStream's minimum). The window is a TTL per
// entry, not the stream's max age: nats-server expires by max age after a
// restart without looking at per-message TTLs, so a max age would take
// tool definitions with it.
func TTL(window time.Duration) string {
	return strconv.FormatInt(max(int64(window/time.Second), 1), 10) + "s"
}

// EnableMsgTTL turns on per-message TTLs on a ledger stream created before
// they were used (enabling changes nothing stored; nats-server refuses to
// turn them off again). An error means the stream does not take them, or
// the server did not answer.
func EnableMsgTTL(ctx context.Context, s jetstream.Stream, js jetstream.JetStream) error {
	cfg := s.CachedInfo().Config
	if cfg.AllowMsgTTL {
		return nil
	}
	cfg.AllowMsgTTL = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("turn on per-message TTLs on stream %s: %w", cfg.Name, err)
	}
	return nil
}
