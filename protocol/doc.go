// Package protocol is cgledger's wire contract (docs/protocol.md) as Go: the
// types of cards, commands, reports, ledger entries, API requests and
// results, call records and tool definitions; the subject grammar and the
// CG-* headers; validation that lists every violation; the error codes and
// their sentinels; and the hash chain that links the entries. It is pure: it
// does no I/O and imports nothing else of cgledger, so a Go client needs
// only it and NATS.
package protocol
