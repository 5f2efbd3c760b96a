package ledger

import (
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
	"github.com/nats-io/nats.go"
)

// expire gives msg the retention window as its TTL (stream.TTL), unless
// its kind is kept forever (stream.KeptForever).
func (l *Ledger) expire(kind protocol.EntryKind, msg *nats.Msg) {
	if l.ttl != "" && !stream.KeptForever(kind) {
		msg.Header.Set(stream.HeaderMsgTTL, l.ttl)
	}
}
