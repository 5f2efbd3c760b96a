package snapshot

import (
	"context"
	"errors"
	"io"

	"github.com/nats-io/nats.go/jetstream"
)

// ObjectStore is a Target keeping snapshots in a JetStream Object Store bucket.
type ObjectStore struct {
	bucket string
	os     jetstream.ObjectStore
}

// BucketName is the default bucket for a ledger stream's snapshots.
func BucketName(stream string) string { return "cgledger_views_" + stream }

// NewObjectStore opens (creating if needed) the bucket with replicas copies.
func NewObjectStore(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*ObjectStore, error) {
	return &ObjectStore{bucket: bucket}, nil
}

// Put implements Target.
func (o *ObjectStore) Put(ctx context.Context, m Manifest, body io.Reader) error {
	return errors.New("snapshot: not implemented")
}

// List implements Target.
func (o *ObjectStore) List(ctx context.Context) ([]Manifest, error) {
	return nil, errors.New("snapshot: not implemented")
}

// Open implements Target.
func (o *ObjectStore) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	return nil, errors.New("snapshot: not implemented")
}

// Delete implements Target.
func (o *ObjectStore) Delete(ctx context.Context, name string) error {
	return errors.New("snapshot: not implemented")
}

// String implements Target.
func (o *ObjectStore) String() string { return "object store " + o.bucket }
