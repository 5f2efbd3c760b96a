package snapshot

import (
	"context"
	"errors"
	"io"
)

// Dir is a Target keeping snapshots as files in a directory.
type Dir struct {
	path string
}

// NewDir returns the directory target at path, creating the directory.
func NewDir(path string) (*Dir, error) { return &Dir{path: path}, nil }

// Put implements Target.
func (d *Dir) Put(ctx context.Context, m Manifest, body io.Reader) error {
	return errors.New("snapshot: not implemented")
}

// List implements Target.
func (d *Dir) List(ctx context.Context) ([]Manifest, error) {
	return nil, errors.New("snapshot: not implemented")
}

// Open implements Target.
func (d *Dir) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	return nil, errors.New("snapshot: not implemented")
}

// Delete implements Target.
func (d *Dir) Delete(ctx context.Context, name string) error {
	return errors.New("snapshot: not implemented")
}

// String implements Target.
func (d *Dir) String() string { return "directory " + d.path }
