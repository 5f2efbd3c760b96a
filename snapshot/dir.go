package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cgledger/cgledger/internal/fsyncdir"
)

// Dir is a Target keeping snapshots as files in one directory: the body as
// <name>.tar and the manifest beside it as <name>.json. Both are written
// under temporary names (starting with "."), fsynced, then renamed, body
// first: a manifest file is the mark of a whole snapshot, and List reads
// nothing else.
type Dir struct {
	path string
	// staleAfter is how old a temporary or unlisted file must be before
	// PurgeOrphans removes it: younger ones may belong to a Put still running
	// in another process.
	staleAfter time.Duration
}

// dirStaleAfter is Dir's default staleAfter.
const dirStaleAfter = time.Hour

const (
	bodyExt     = ".tar"
	manifestExt = ".json"
	tempPrefix  = "."
)

// NewDir returns the directory target at path, creating the directory.
func NewDir(path string) (*Dir, error) {
	if path == "" {
		return nil, errors.New("snapshot: directory target: the path is empty")
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, fmt.Errorf("snapshot: directory target: %w", err)
	}
	return &Dir{path: path, staleAfter: dirStaleAfter}, nil
}

// Put implements Target.
func (d *Dir) Put(ctx context.Context, m Manifest, body io.Reader) error {
	if err := checkName(m.Name); err != nil {
		return err
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("snapshot: put %s: %w", m.Name, err)
	}
	tmpBody, err := d.writeTemp(m.Name+bodyExt, &ctxReader{ctx: ctx, r: body}, m.Size)
	if err != nil {
		return err
	}
	tmpMan, err := d.writeTemp(m.Name+manifestExt, strings.NewReader(string(raw)), int64(len(raw)))
	if err != nil {
		_ = os.Remove(tmpBody)
		return err
	}
	if err := os.Rename(tmpBody, d.file(m.Name+bodyExt)); err != nil {
		_ = os.Remove(tmpBody)
		_ = os.Remove(tmpMan)
		return fmt.Errorf("snapshot: put %s: %w", m.Name, err)
	}
	if err := os.Rename(tmpMan, d.file(m.Name+manifestExt)); err != nil {
		_ = os.Remove(tmpMan)
		return fmt.Errorf("snapshot: put %s: %w", m.Name, err)
	}
	if err := fsyncdir.Sync(d.path); err != nil {
		return fmt.Errorf("snapshot: put %s: %w", m.Name, err)
	}
	return nil
}

// writeTemp writes r to a new temporary file for name, fsyncs it and
// returns its path; it fails unless r held exactly size bytes.
func (d *Dir) writeTemp(name string, r io.Reader, size int64) (string, error) {
	f, err := os.CreateTemp(d.path, tempPrefix+name+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("snapshot: put %s: %w", name, err)
	}
	n, err := io.Copy(f, r)
	if err == nil && n != size {
		err = fmt.Errorf("%d bytes, the manifest says %d", n, size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", fmt.Errorf("snapshot: put %s: %w", name, err)
	}
	return f.Name(), nil
}

// List implements Target. A manifest whose body is missing or of another
// size is not listed.
func (d *Dir) List(ctx context.Context) ([]Manifest, error) {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return nil, fmt.Errorf("snapshot: list %s: %w", d, err)
	}
	var ms []Manifest
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), manifestExt)
		if !ok || checkName(name) != nil || !e.Type().IsRegular() {
			continue
		}
		m, ok, err := d.manifest(name)
		if err != nil {
			return nil, err
		}
		if ok {
			ms = append(ms, m)
		}
	}
	sortNewestFirst(ms)
	return ms, ctx.Err()
}

// manifest reads the manifest of name, and false when the snapshot is not
// whole (unreadable manifest, body missing or of another size).
func (d *Dir) manifest(name string) (Manifest, bool, error) {
	raw, err := os.ReadFile(d.file(name + manifestExt))
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, false, nil
	}
	if err != nil {
		return Manifest{}, false, fmt.Errorf("snapshot: list %s: %w", d, err)
	}
	var m Manifest
	if json.Unmarshal(raw, &m) != nil || m.Name != name {
		return Manifest{}, false, nil
	}
	st, err := os.Stat(d.file(name + bodyExt))
	if err != nil || st.Size() != m.Size {
		return Manifest{}, false, nil
	}
	return m, true, nil
}

// Open implements Target.
func (d *Dir) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	f, err := os.Open(d.file(name + bodyExt))
	if err != nil {
		return nil, fmt.Errorf("snapshot: open %s in %s: %w", name, d, err)
	}
	return f, nil
}

// Delete implements Target: the manifest goes first, so a Delete cut short
// leaves at worst a body PurgeOrphans removes.
func (d *Dir) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	for _, ext := range []string{manifestExt, bodyExt} {
		if err := os.Remove(d.file(name + ext)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("snapshot: delete %s from %s: %w", name, d, err)
		}
	}
	if err := fsyncdir.Sync(d.path); err != nil {
		return fmt.Errorf("snapshot: delete %s: %w", name, err)
	}
	return nil
}

// PurgeOrphans removes what interrupted Puts and Deletes left, and
// snapshots that are not whole: temporary files, bodies without a manifest,
// and manifests whose body is missing or of another size (with that body),
// once they are an hour old (a younger one may be a Put still running). It
// returns the names removed.
func (d *Dir) PurgeOrphans(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return nil, fmt.Errorf("snapshot: purge %s: %w", d, err)
	}
	var removed []string
	for _, e := range ents {
		n := e.Name()
		orphan := strings.HasPrefix(n, tempPrefix) && strings.HasSuffix(n, ".tmp")
		if name, ok := strings.CutSuffix(n, bodyExt); ok && checkName(name) == nil {
			_, err := os.Stat(d.file(name + manifestExt))
			orphan = errors.Is(err, fs.ErrNotExist)
		}
		// A manifest whose snapshot is not whole (its body truncated or
		// missing) is never listed, so no prune would reach it. Put renames
		// the body into place before the manifest, so it is no Put still
		// running. Its body, named after it in the listing, is then a body
		// without a manifest and goes too.
		if name, ok := strings.CutSuffix(n, manifestExt); ok && checkName(name) == nil {
			_, whole, err := d.manifest(name)
			if err != nil {
				return removed, fmt.Errorf("snapshot: purge %s: %w", d, err)
			}
			orphan = !whole
		}
		if !orphan {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < d.staleAfter {
			continue
		}
		if err := os.Remove(d.file(n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("snapshot: purge %s: %w", d, err)
		}
		removed = append(removed, n)
	}
	return removed, ctx.Err()
}

func (d *Dir) file(name string) string { return filepath.Join(d.path, name) }

// String implements Target.
func (d *Dir) String() string { return "directory " + d.path }

// ctxReader stops a read when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
