package protocol

import (
	"bytes"
	"time"
)

// ViewsSnapshotResult is the answer of views.snapshot: the manifest of the
// snapshot the answering serve process took of its views, where it was
// kept, and what was pruned after it (docs/protocol.md#viewssnapshot).
type ViewsSnapshotResult struct {
	// Name is unique and sorts as the snapshots do:
	// views-f<format>-<applied_seq, 20 digits>-<created, Unix ms>.
	Name string `json:"name"`
	// Version is the snapshot's layout (1).
	Version int `json:"version"`
	// ViewsFormat is the views format of the store it was taken from
	// (docs/views.md#format).
	ViewsFormat int `json:"views_format"`
	// Stream is the ledger stream the views follow.
	Stream string `json:"stream"`
	// AppliedSeq is the views' checkpoint sequence in the snapshot.
	AppliedSeq uint64 `json:"applied_seq"`
	// ChainHead is the chain link at AppliedSeq, lower-case hex.
	ChainHead string `json:"chain_head"`
	// Digest is the view digest of the snapshot (docs/views.md#digest).
	Digest string `json:"digest"`
	// Created is when the snapshot was taken.
	Created time.Time `json:"created"`
	// Host is the host name of the serve process that took it.
	Host string `json:"host,omitempty"`
	// Size is the snapshot's body in bytes.
	Size int64 `json:"size"`
	// Files is the number of files of the store's checkpoint in it.
	Files int `json:"files"`
	// Target is where it was kept: "object store <bucket>" or
	// "directory <path>".
	Target string `json:"target"`
	// DurationMS is how long taking and storing it took, in milliseconds;
	// absent in a listing.
	DurationMS int64 `json:"duration_ms,omitempty"`
	// Pruned names the older snapshots removed after it (views_snapshot_keep).
	Pruned []string `json:"pruned,omitempty"`
}

// ViewsSnapshotListResult is the answer of views.snapshot.list: the
// snapshots where the answering serve process keeps them, newest first
// (the fields of each as views.snapshot answers them, without DurationMS
// and Pruned).
type ViewsSnapshotListResult struct {
	// Target is where they are kept: "object store <bucket>" or
	// "directory <path>".
	Target string `json:"target"`
	// Snapshots are newest first: by applied_seq, then created.
	Snapshots []ViewsSnapshotResult `json:"snapshots"`
}

// ParseViewsSnapshotRequest reads a views.snapshot or views.snapshot.list
// body, which names
// nothing but must be a JSON object when sent; an empty body is the same
// as {}.
func ParseViewsSnapshotRequest(body []byte) Violations {
	var vs Violations
	if len(bytes.TrimSpace(body)) > 0 {
		ParseObject("body", body, &vs)
	}
	return vs
}
