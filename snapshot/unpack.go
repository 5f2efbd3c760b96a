package snapshot

import (
	"archive/tar"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"time"

	"github.com/cgledger/cgledger/internal/fsyncdir"
	"github.com/cgledger/cgledger/internal/pipehash"
)

// unpack reads the body r of the snapshot listed with m into dir (which
// exists and is empty) and checks it against m: the manifest inside equals
// the listed one, every member is a file m lists with its size and SHA-256,
// none is missing and the body is m.Size bytes. The error says which check
// failed. It returns every file and directory written, for syncWritten:
// nothing is fsynced here, so the writeback runs beside the checks that
// follow instead of before them.
func unpack(ctx context.Context, r io.Reader, m Manifest, dir string) (written writtenPaths, err error) {
	cr := &countingReader{r: r}
	tr := tar.NewReader(cr)
	hdr, err := tr.Next()
	if err != nil {
		return writtenPaths{}, fmt.Errorf("body: first member: %w", err)
	}
	if hdr.Name != manifestMember {
		return writtenPaths{}, fmt.Errorf("body: first member is %q, not %s", hdr.Name, manifestMember)
	}
	var inner Manifest
	if err := json.NewDecoder(io.LimitReader(tr, 64<<20)).Decode(&inner); err != nil {
		return writtenPaths{}, fmt.Errorf("body: manifest: %w", err)
	}
	if !sameManifest(inner, m) {
		return writtenPaths{}, errors.New("body: the manifest inside differs from the one listed beside it")
	}
	want := make(map[string]File, len(m.Files))
	for _, f := range m.Files {
		want[f.Name] = f
	}
	dirs := map[string]bool{dir: true}
	for {
		if err := ctx.Err(); err != nil {
			return writtenPaths{}, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return writtenPaths{}, fmt.Errorf("body: %w", err)
		}
		rel, err := memberName(hdr.Name)
		if err != nil {
			return writtenPaths{}, fmt.Errorf("body: %w", err)
		}
		f, ok := want[rel]
		if !ok {
			return writtenPaths{}, fmt.Errorf("body: file %s is not in the manifest (or appears twice)", rel)
		}
		delete(want, rel)
		if hdr.Typeflag != tar.TypeReg {
			return writtenPaths{}, fmt.Errorf("body: file %s is not a regular file (tar type %q)", rel, hdr.Typeflag)
		}
		if hdr.Size != f.Size {
			return writtenPaths{}, fmt.Errorf("body: file %s: %d bytes, the manifest says %d", rel, hdr.Size, f.Size)
		}
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return writtenPaths{}, &installError{fmt.Errorf("unpack: %w", err)}
		}
		dirs[filepath.Dir(p)] = true
		if err := writeChecked(tr, p, f); err != nil {
			return writtenPaths{}, err
		}
		written.files = append(written.files, p)
		stepHook("unpacking")
	}
	for name := range want {
		return writtenPaths{}, fmt.Errorf("body: file %s of the manifest is missing", name)
	}
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return writtenPaths{}, fmt.Errorf("body: %w", err)
	}
	if cr.n != m.Size {
		return writtenPaths{}, fmt.Errorf("body: %d bytes, the manifest says %d", cr.n, m.Size)
	}
	for d := range dirs {
		written.dirs = append(written.dirs, d)
	}
	stepHook("unpacked")
	return written, nil
}

// writeChecked writes r to a new file at p and fails unless its bytes have
// f's SHA-256. A failure to write the file (a full disk) is an
// installError: it is the host's, not the snapshot's, and every other
// snapshot would meet it too.
func writeChecked(r io.Reader, p string, f File) error {
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return &installError{fmt.Errorf("unpack: %w", err)}
	}
	h := pipehash.New()
	_, err = io.Copy(io.MultiWriter(localWriter{out}, h), r)
	sum := h.Sum()
	if cerr := out.Close(); err == nil && cerr != nil {
		err = &installError{cerr}
	}
	if err != nil {
		var inst *installError
		if errors.As(err, &inst) {
			return &installError{fmt.Errorf("unpack: file %s: %w", f.Name, inst.err)}
		}
		return fmt.Errorf("body: file %s: %w", f.Name, err)
	}
	if got := hex.EncodeToString(sum); got != f.SHA256 {
		return fmt.Errorf("body: file %s: sha256 %s, the manifest says %s", f.Name, got, f.SHA256)
	}
	return nil
}

// localWriter marks the errors of writing the local file as installErrors,
// apart from those of reading the body.
type localWriter struct{ f *os.File }

func (w localWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	if err != nil {
		err = &installError{err}
	}
	return n, err
}

// writtenPaths is what unpack wrote: the files, and the directories that name
// them.
type writtenPaths struct{ files, dirs []string }

// syncWritten fsyncs every file and directory unpack wrote (files first,
// then the directories that name them, through fsyncdir), so a rename of
// the unpacked views into place survives a crash with their contents.
func syncWritten(w writtenPaths) error {
	for _, p := range w.files {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("unpack: sync: %w", err)
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("unpack: sync %s: %w", p, err)
		}
	}
	for _, d := range w.dirs {
		if err := fsyncdir.Sync(d); err != nil {
			return fmt.Errorf("unpack: %w", err)
		}
	}
	return nil
}

// sameManifest reports whether two manifests say the same thing (times
// compared as instants).
func sameManifest(a, b Manifest) bool {
	if !a.Created.Equal(b.Created) {
		return false
	}
	a.Created, b.Created = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}
