// Package fsyncdir makes the names in a directory durable: after a create,
// rename or removal in it, the directory itself must be fsynced for the
// change to survive a crash or a power loss.
package fsyncdir

import (
	"errors"
	"fmt"
	"os"
)

// Sync fsyncs the directory dir. A file system that cannot sync a
// directory (os.ErrInvalid) is not an error: there is nothing more to do.
func Sync(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
