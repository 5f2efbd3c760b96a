package projector

import (
	"encoding/binary"
	"time"
)

// Key layout (docs/views.md). Every key is a tag, then parts separated by
// 0x00: strings as their bytes (identifiers and names never contain 0x00),
// sequences and times as 8-byte big-endian integers so that byte order is
// numeric order. Versioned rows end in the sequence that wrote them, so "as of
// sequence S" is a SeekLT to the row's prefix + S+1.
const (
	tagMeta     = "meta"   // meta\0applied -> applied seq, chain head, time watermark; meta\0format -> ViewsFormat
	tagEntry    = "e"      // e\0<seq> -> the entry (kind, subject, time, headers, data) when no tl row holds it
	tagLink     = "h"      // h\0<seq> -> chain link after <seq>
	tagTime     = "ts"     // ts\0<watermark ns>\0<seq> -> (empty): as-of-time lookup
	tagCard     = "card"   // card\0<project>\0<card_id>\0<seq> -> entry time, card JSON (each version)
	tagTurnCard = "tcard"  // tcard\0<project>\0<turn>\0<seq> -> card_id
	tagTimeline = "tl"     // tl\0<project>\0<turn>\0<tool_call_id or empty>\0<seq> -> the entry
	tagStory    = "cs"     // cs\0<project>\0<tool_call_id>\0<turn> -> (empty): the call has entries in the turn
	tagState    = "st"     // st\0<project>\0<turn>\0<call>\0<seq> -> CallState JSON (each version)
	tagInbox    = "inbox"  // inbox\0<project>\0<agent>\0<report_seq> -> InboxEntry JSON
	tagConsumed = "inboxc" // inboxc\0<project>\0<agent>\0<report_seq> -> consumed seq + time
	tagPending  = "pend"   // pend\0<project>\0<agent>\0<report_seq> -> (empty) while pending
	tagRoster   = "roster" // roster\0<project>\0<agent>\0<seq> -> worker_target
	tagIndex    = "ix"     // ix\0<project>\0<dimension>\0<value>\0<dispatch ns>\0<dispatch seq> -> turn\0call
	tagReject   = "rj"     // rj\0<project>\0<seq> -> rejection code
	tagTool     = "tool"   // tool\0<project>\0<tool_name>\0<seq> -> definition JSON (each version)
	tagUnrec    = "un"     // un\0<seq> -> why the entry is unrecognized (a protocol.Unrecognized* code)
	tagSkipped  = "sk"     // sk\0<seq> -> skip entry seq, skip reason: an entry recorded as skipped
	tagSkip     = "skp"    // skp\0<skip seq> -> skipped seq, reason: a valid skip entry
	tagProject  = "proj"   // proj\0<project> -> first seq, first time: the project index
	tagLost     = "lost"   // lost\0<first seq> -> last seq: entries lost before they were archived
	tagOpen     = "open"   // open\0<tool_name>\0<dispatch ns>\0<dispatch seq> -> deadline_unix_ms: a dispatched call not yet reported

	// Approvals (docs/approvals.md): a held call's rows, listed in the
	// order the calls were held.
	tagHeld       = "ap"  // ap\0<project>\0<held seq> -> the held call's ApprovalItem JSON (state pending, no arguments)
	tagDecided    = "apd" // apd\0<project>\0<held seq> -> approval entry seq, then its decision JSON (approvalDecision)
	tagAwaiting   = "apw" // apw\0<project>\0<held seq> -> (empty) while the held call has no decision
	tagHeldCall   = "apc" // apc\0<project>\0<turn>\0<call> -> held seq: a held call by its ids
	tagAwaitingBy = "apt" // apt\0<tool_name>\0<held ns>\0<held seq> -> (empty) while undecided: the approval gauges

	// Pauses (docs/operations.md, "Operator actions").
	tagToolPause = "tp" // tp\0<project>\0<tool_name>\0<seq> -> the tool_pause entry's data (each pause and resume)
)

// projectRowTags are the project-scoped row kinds whose key ends in the
// sequence of the entry that wrote them: tag\0<project>\0...\0<seq>. A
// project's first entry is the smallest such sequence (the applier notes
// it as it writes them), so a new project-scoped row kind of that form belongs here. The other
// project-scoped rows (ix, inboxc, pend, apd, apw, apc) are always written next to one of
// these by the same entry.
var projectRowTags = []string{tagCard, tagTurnCard, tagTimeline, tagState, tagInbox, tagRoster, tagReject, tagTool, tagHeld, tagToolPause}

// isProjectRowTag reports whether tag is one of projectRowTags.
func isProjectRowTag(tag []byte) bool {
	switch string(tag) {
	case tagCard, tagTurnCard, tagTimeline, tagState, tagInbox, tagRoster, tagReject, tagTool, tagHeld, tagToolPause:
		return true
	}
	return false
}

// Index dimensions of the ix rows.
const (
	dimAll     = "all"
	dimTool    = "tool"
	dimAgent   = "agent"
	dimChannel = "channel"
	dimStatus  = "status"
	dimState   = "state"
)

var metaApplied = key(tagMeta, "applied")

// keyBuf builds keys.
type keyBuf []byte

func key(tag string, parts ...string) keyBuf {
	k := keyBuf(append(make([]byte, 0, 64), tag...))
	for _, p := range parts {
		k = append(k, 0)
		k = append(k, p...)
	}
	return k
}

// str appends a string part.
func (k keyBuf) str(s string) keyBuf {
	k = append(k, 0)
	return append(k, s...)
}

// u64 appends a big-endian integer part.
func (k keyBuf) u64(n uint64) keyBuf {
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, n)
}

// t appends a time part (Unix nanoseconds; times before 1970 clamp to 0).
func (k keyBuf) t(t time.Time) keyBuf {
	ns := t.UnixNano()
	if ns < 0 {
		ns = 0
	}
	return k.u64(uint64(ns))
}

// prefix returns the key followed by the separator, for prefix scans.
func (k keyBuf) prefix() []byte { return append(append([]byte(nil), k...), 0) }

// upperBound returns the smallest key greater than every key with prefix p.
func upperBound(p []byte) []byte {
	u := append([]byte(nil), p...)
	for i := len(u) - 1; i >= 0; i-- {
		if u[i] < 0xff {
			u[i]++
			return u[:i+1]
		}
	}
	return nil
}

// trailingU64 reads the 8-byte integer at the end of a key.
func trailingU64(k []byte) uint64 {
	if len(k) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(k[len(k)-8:])
}
