// Package snapshot takes, keeps, prunes and restores snapshots of the
// projector's views (issue 31; docs/views.md#snapshots). A snapshot is a
// Pebble checkpoint of the views store packed as an uncompressed tar with
// its Manifest first; a Target (a directory or a JetStream Object Store
// bucket) keeps the bodies with their manifests beside them, so a new replica
// restores the newest snapshot that passes every check and catches up from
// its sequence instead of rebuilding from sequence 1.
package snapshot
