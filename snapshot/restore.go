package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/fsyncdir"
	"github.com/cgledger/cgledger/projector"
)

// ErrNoSnapshot is returned by Restore when the target holds no snapshot
// that passes every check.
var ErrNoSnapshot = errors.New("snapshot: no snapshot passes every check")

// RestoreOptions configures Restore. Stream and JS are required.
type RestoreOptions struct {
	// Stream is the ledger stream the snapshot must belong to.
	Stream string
	// JS reads the stream's entries for the chain check and its first and last sequence.
	JS jetstream.JetStream
	// Log receives every refused snapshot with its reason; nil means slog.Default().
	Log *slog.Logger
	// TempDir is where a snapshot is unpacked before it is moved to
	// viewsDir; "" means beside viewsDir. It must be on viewsDir's
	// filesystem (the move is a rename).
	TempDir string
}

// restoreTempPrefix starts the name of the directory a snapshot is
// unpacked in; Restore removes what a killed restore left of its own.
const restoreTempPrefix = ".cgledger-restore-"

// Restore installs the newest snapshot that passes every check into viewsDir
// (which must not exist or be empty; the caller moves old views away first)
// and returns its manifest. ErrNoSnapshot when the target holds none that
// passes; *RefusedError lists each refused snapshot and why.
//
// Each snapshot is unpacked into a temporary directory, checked
// (docs/views.md#snapshots), fsynced, and only then renamed to viewsDir and
// the parent fsynced: a restore killed at any step leaves either no views or
// a whole restored store.
func Restore(ctx context.Context, t Target, viewsDir string, o RestoreOptions) (Manifest, error) {
	if t == nil || o.JS == nil || o.Stream == "" || viewsDir == "" {
		return Manifest{}, errors.New("snapshot: restore: a target, a views directory, a stream and a JetStream context are required")
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	if err := checkEmpty(viewsDir); err != nil {
		return Manifest{}, err
	}
	tempDir := o.TempDir
	if tempDir == "" {
		tempDir = filepath.Dir(viewsDir)
	}
	if err := os.MkdirAll(tempDir, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("snapshot: restore: %w", err)
	}
	prefix := restoreTempPrefix + filepath.Base(viewsDir) + "-"
	removeLeftovers(tempDir, prefix)
	ms, err := t.List(ctx)
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: restore: %w", err)
	}
	var refused []Refusal
	for _, m := range ms {
		err := restoreOne(ctx, t, m, viewsDir, tempDir, prefix, o)
		if err == nil {
			log.Info("views restored from a snapshot", "snapshot", m.Name, "target", t.String(), "applied_seq", m.AppliedSeq, "digest", m.Digest)
			return m, nil
		}
		if ctx.Err() != nil {
			return Manifest{}, fmt.Errorf("snapshot: restore: %w", ctx.Err())
		}
		var inst *installError
		if errors.As(err, &inst) {
			return Manifest{}, fmt.Errorf("snapshot: restore %s: %w", m.Name, err)
		}
		log.Warn("views snapshot refused", "snapshot", m.Name, "target", t.String(), "reason", err.Error())
		refused = append(refused, Refusal{Name: m.Name, Reason: err.Error()})
	}
	if len(refused) == 0 {
		return Manifest{}, fmt.Errorf("%w: %s holds no snapshot", ErrNoSnapshot, t)
	}
	return Manifest{}, &RefusedError{Refused: refused}
}

// installError is a failure that is not the snapshot's: the stream cannot
// be read, the temporary directory cannot be made, the checked snapshot
// cannot be moved into place. Every other snapshot would fail the same
// way, so Restore stops there.
type installError struct{ err error }

func (e *installError) Error() string { return e.err.Error() }
func (e *installError) Unwrap() error { return e.err }

// restoreOne checks m and, when it passes, installs it in viewsDir.
func restoreOne(ctx context.Context, t Target, m Manifest, viewsDir, tempDir, prefix string, o RestoreOptions) error {
	if err := checkManifest(m, o.Stream); err != nil {
		return err
	}
	first, last, err := streamRange(ctx, o.JS, o.Stream)
	if err != nil {
		return &installError{err}
	}
	if first > m.AppliedSeq+1 || last < m.AppliedSeq {
		return fmt.Errorf("stream %s holds entries %d to %d: it cannot continue from the snapshot's sequence %d", o.Stream, first, last, m.AppliedSeq)
	}
	tmp, err := os.MkdirTemp(tempDir, prefix)
	if err != nil {
		return &installError{err}
	}
	defer os.RemoveAll(tmp)
	unpacked := filepath.Join(tmp, "views")
	if err := os.Mkdir(unpacked, 0o755); err != nil {
		return &installError{err}
	}
	body, err := t.Open(ctx, m.Name)
	if err != nil {
		return err
	}
	written, err := unpack(ctx, body, m, unpacked)
	if cerr := body.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("body: %w", cerr)
	}
	if err != nil {
		return err
	}
	// The writeback of what was unpacked (I/O) runs beside the checks
	// (mostly the digest, CPU) and must end before the rename.
	synced := make(chan error, 1)
	go func() { synced <- syncWritten(written) }()
	err = checkViews(ctx, unpacked, m, first, o)
	if serr := <-synced; serr != nil {
		return &installError{serr}
	}
	if err != nil {
		return err
	}
	if err := install(unpacked, viewsDir); err != nil {
		return &installError{err}
	}
	return nil
}

// checkManifest is the checks of the manifest alone.
func checkManifest(m Manifest, stream string) error {
	var errs []error
	if m.Version != Version {
		errs = append(errs, fmt.Errorf("snapshot layout version %d, this release reads %d", m.Version, Version))
	}
	if m.ViewsFormat != projector.ViewsFormat {
		errs = append(errs, fmt.Errorf("views format %d, this release's is %d", m.ViewsFormat, projector.ViewsFormat))
	}
	if m.Stream != stream {
		errs = append(errs, fmt.Errorf("taken from stream %q, not %q", m.Stream, stream))
	}
	return errors.Join(errs...)
}

// streamRange returns the first and last sequence the stream holds (first
// is last+1 when it holds none).
func streamRange(ctx context.Context, js jetstream.JetStream, stream string) (first, last uint64, err error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	st := s.CachedInfo().State
	if st.Msgs == 0 {
		return st.LastSeq + 1, st.LastSeq, nil
	}
	return st.FirstSeq, st.LastSeq, nil
}

// checkViews opens the unpacked views read-only and checks their format,
// digest, sequence and head against m, then the chain against the stream.
func checkViews(ctx context.Context, dir string, m Manifest, first uint64, o RestoreOptions) error {
	views, err := projector.OpenCheckpoint(dir)
	if err != nil {
		return err
	}
	defer views.Close()
	format, err := views.Format()
	if err != nil {
		return err
	}
	if format != m.ViewsFormat {
		return fmt.Errorf("the views inside are of format %d, the manifest says %d", format, m.ViewsFormat)
	}
	d, err := views.DigestNow()
	if err != nil {
		return err
	}
	if d.Digest != m.Digest || d.AppliedSeq != m.AppliedSeq || d.ChainHead != m.ChainHead {
		return fmt.Errorf("the views inside have digest %s at seq %d head %s, the manifest says digest %s at seq %d head %s",
			d.Digest, d.AppliedSeq, d.ChainHead, m.Digest, m.AppliedSeq, m.ChainHead)
	}
	return checkChain(ctx, views, m, first, o)
}

// checkEmpty fails unless dir is missing or an empty directory.
func checkEmpty(dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); !errors.Is(err, io.EOF) {
		if err == nil {
			return fmt.Errorf("snapshot: restore: %s is not empty: move the old views away first", dir)
		}
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	return nil
}

// install renames the checked views to viewsDir (replacing an empty
// directory there) and fsyncs the parent, so the rename survives a crash.
func install(unpacked, viewsDir string) error {
	if err := checkEmpty(viewsDir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(viewsDir), 0o755); err != nil {
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	// An empty directory is removed first (os.Remove refuses a non-empty
	// one): rename does not replace a directory. A crash between the two
	// leaves no views, which the next start restores again.
	if err := os.Remove(viewsDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	if err := os.Rename(unpacked, viewsDir); err != nil {
		return fmt.Errorf("snapshot: restore: move the views into place: %w", err)
	}
	if err := fsyncdir.Sync(filepath.Dir(viewsDir)); err != nil {
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	return nil
}

// removeLeftovers removes the unpack directories of killed restores into
// the same views directory.
func removeLeftovers(dir, prefix string) {
	matches, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
	for _, p := range matches {
		_ = os.RemoveAll(p)
	}
}
