// Package stream is the ledger stream's format and history: the stream
// and bucket configuration and their provisioning (Config, Provision),
// retention and per-entry TTLs, the export file format (ExportHeader,
// ExportEntry, ExportTrailer: reading, writing, verifying and importing
// it), history reads across the stream and lost ranges (History), and the
// skip lookup (FindSkip). It holds what every reader of the ledger needs
// and nothing of the writer: package ledger writes the stream, and the
// projector, the archive, replay and the executor read it through this
// package without importing ledger.
package stream
