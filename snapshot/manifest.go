package snapshot

import (
	"time"
)

// Version is the snapshot layout this package writes and restores.
const Version = 1

// Manifest describes one snapshot; it is stored beside the snapshot's body
// (object metadata or a sidecar file) so List reads no body, and inside the
// body as its first member.
type Manifest struct {
	// Name is unique and sortable: "views-f<format>-<applied_seq %020d>-<created unix ms>".
	Name string `json:"name"`
	// Version is the snapshot layout (Version).
	Version int `json:"version"`
	// ViewsFormat is projector.ViewsFormat of the store it was taken from.
	ViewsFormat int `json:"views_format"`
	// Stream is the ledger stream's name.
	Stream string `json:"stream"`
	// AppliedSeq is the views' checkpoint sequence inside the snapshot.
	AppliedSeq uint64 `json:"applied_seq"`
	// ChainHead is the hex chain link at AppliedSeq.
	ChainHead string `json:"chain_head"`
	// Digest is the projector view digest of the snapshot (docs/views.md#digest).
	Digest string `json:"digest"`
	// Created is when the snapshot was taken.
	Created time.Time `json:"created"`
	// Host is the host that took it, for operators; empty when unknown.
	Host string `json:"host,omitempty"`
	// Size is the number of bytes of the body.
	Size int64 `json:"size"`
	// Files lists every file of the Pebble checkpoint.
	Files []File `json:"files"`
}

// File is one file of a snapshot's Pebble checkpoint.
type File struct {
	// Name is the file's path relative to the checkpoint directory.
	Name string `json:"name"`
	// Size is its length in bytes.
	Size int64 `json:"size"`
	// SHA256 is the hex SHA-256 of its bytes.
	SHA256 string `json:"sha256"`
}
