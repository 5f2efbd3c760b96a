package projector

import (
	"fmt"

	"github.com/cgledger/cgledger/protocol"
)

// The bodies of the audit API's answers that are not a query's result as
// it is (docs/audit-api.md); httpapi serves them and the HTTP client reads
// them.

// CallStateAnswer is the body of GET .../turns/{turn}/calls/{call}.
type CallStateAnswer struct {
	AsOfSeq uint64     `json:"as_of_seq"`
	Call    *CallState `json:"call"`
}

// RosterAnswer is the body of GET .../agents/{agent}/roster.
type RosterAnswer struct {
	AsOfSeq uint64 `json:"as_of_seq"`
	protocol.RosterResult
}

// ChainLink is the body of GET /v1/chain/{seq}: the chain link (hex) the
// views recorded after applying seq.
type ChainLink struct {
	Seq  uint64 `json:"seq"`
	Link string `json:"link"`
}

// ApprovalAnswer is the body of GET /v1/projects/{project}/approvals/{turn}/{call}.
type ApprovalAnswer struct {
	AsOfSeq  uint64       `json:"as_of_seq"`
	Approval ApprovalItem `json:"approval"`
}

// Digest is the views' digest now (Store.DigestNow).
func (q *Queries) Digest() (DigestResult, error) { return q.store.DigestNow() }

// ChainLinkAt is the live chain's link after seq, so that an export can be
// compared with the ledger it claims to come from. A seq without a link is
// a not_found error saying why: expired before it was archived, or not yet
// applied.
func (q *Queries) ChainLinkAt(seq uint64) (ChainLink, error) {
	link, ok, err := q.store.LinkAt(seq)
	if err != nil {
		return ChainLink{}, err
	}
	if !ok {
		msg := fmt.Sprintf("no chain link at seq %d", seq)
		applied, _, _ := q.store.ChainHead()
		if first, last, lost, _ := q.store.LostAt(seq); lost {
			msg += fmt.Sprintf(": entries %d-%d expired before they were archived", first, last)
		} else if seq > applied {
			msg += fmt.Sprintf(": the views have applied through seq %d", applied)
		}
		return ChainLink{}, &protocol.Error{Code: protocol.CodeNotFound, Message: msg}
	}
	return ChainLink{Seq: seq, Link: link.String()}, nil
}

// ProjectsCursor checks cursors of the projects listing.
func ProjectsCursor() CursorCheck { return prefixCursor(key(tagProject).prefix()) }

// UnrecognizedCursor checks cursors of the unrecognized entries' listing.
func UnrecognizedCursor() CursorCheck { return seqCursor(tagUnrec) }

// SkippedCursor checks cursors of the skipped entries' listing.
func SkippedCursor() CursorCheck { return seqCursor(tagSkipped) }

// SkipsCursor checks cursors of the skip entries' listing.
func SkipsCursor() CursorCheck { return seqCursor(tagSkip) }

// IsCursor reports whether c is the encoding of some list's cursor (which
// list is a CursorCheck's question).
func IsCursor(c string) bool {
	_, err := cursorEncoding.DecodeString(c)
	return err == nil
}
