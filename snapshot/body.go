package snapshot

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// The body is an uncompressed tar (the sstables are compressed already):
// manifestMember first, then every checkpoint file under viewsPrefix.
const (
	manifestMember = "manifest.json"
	viewsPrefix    = "views/"
	tarBlock       = 512
)

// checkpointFiles lists every regular file under dir with its size and
// SHA-256, in name order.
func checkpointFiles(dir string) ([]File, error) {
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		files = append(files, File{Name: filepath.ToSlash(rel), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot: list checkpoint files: %w", err)
	}
	return files, nil
}

// memberSize is the bytes a tar member of size bytes takes: its header
// block and its data padded to whole blocks.
func memberSize(size int64) int64 {
	return tarBlock + (size+tarBlock-1)/tarBlock*tarBlock
}

// setBodySize sets m.Size to the length of the body writeBody writes for
// m. The manifest is inside the body and holds the size, so it is found
// by iterating until the manifest's own length stops changing it (twice at
// most: only the digits of Size move).
func setBodySize(m *Manifest) error {
	var files int64
	for _, f := range m.Files {
		files += memberSize(f.Size)
	}
	for range 8 {
		raw, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("snapshot: encode manifest: %w", err)
		}
		size := memberSize(int64(len(raw))) + files + 2*tarBlock
		if size == m.Size {
			return nil
		}
		m.Size = size
	}
	return fmt.Errorf("snapshot: body size of %s does not settle", m.Name)
}

// writeBody writes the tar of m and the checkpoint in dir to w, and fails
// unless it wrote exactly m.Size bytes of the files m lists.
func writeBody(ctx context.Context, w io.Writer, m Manifest, dir string) error {
	cw := &countingWriter{w: w}
	tw := tar.NewWriter(cw)
	raw, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("snapshot: encode manifest: %w", err)
	}
	mod := m.Created.Truncate(time.Second)
	hdr := func(name string, size int64) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o644, ModTime: mod, Format: tar.FormatUSTAR}
	}
	if err := tw.WriteHeader(hdr(manifestMember, int64(len(raw)))); err != nil {
		return fmt.Errorf("snapshot: write body: %w", err)
	}
	if _, err := tw.Write(raw); err != nil {
		return fmt.Errorf("snapshot: write body: %w", err)
	}
	for i, f := range m.Files {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("snapshot: write body: %w", err)
		}
		if i == len(m.Files)/2 {
			stepHook("uploading")
		}
		if err := tw.WriteHeader(hdr(viewsPrefix+f.Name, f.Size)); err != nil {
			return fmt.Errorf("snapshot: write body: %w", err)
		}
		if err := copyFile(tw, filepath.Join(dir, filepath.FromSlash(f.Name)), f.Size); err != nil {
			return fmt.Errorf("snapshot: write body: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("snapshot: write body: %w", err)
	}
	if cw.n != m.Size {
		return fmt.Errorf("snapshot: write body: wrote %d bytes, the manifest says %d", cw.n, m.Size)
	}
	return nil
}

// copyFile copies exactly size bytes of the file at p to w.
func copyFile(w io.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return fmt.Errorf("copy %s: %w", p, err)
	}
	if n != size {
		return fmt.Errorf("copy %s: %d bytes, listed with %d", p, n, size)
	}
	return nil
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// memberName returns the checkpoint file name of a views member, refusing
// any name that is not a plain relative path.
func memberName(name string) (string, error) {
	rel, ok := strings.CutPrefix(name, viewsPrefix)
	if !ok || rel == "" || path.Clean(rel) != rel || path.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("member %q is not a file of the views", name)
	}
	return rel, nil
}
