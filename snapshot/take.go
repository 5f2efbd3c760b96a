package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cgledger/cgledger/projector"
)

// TakeOptions configures Take. The zero value takes a snapshot of no named
// stream, without a host, with the checkpoint made in os.TempDir.
type TakeOptions struct {
	// Stream is the ledger stream the views were built from; Restore only
	// uses a snapshot of the stream it restores for.
	Stream string
	// Host names the taker in the manifest; empty leaves it out.
	Host string
	// TempDir is where the checkpoint is made; "" means os.TempDir. On the
	// views' filesystem Pebble hard-links the sstables instead of copying
	// them.
	TempDir string
}

// Take writes a consistent snapshot of s to t and returns its manifest:
// a Pebble checkpoint of the views (made in a temporary directory removed
// afterwards), its digest, sequence and head read back from the
// checkpoint, packed as a tar streamed to t.Put. A Take that fails or is
// killed leaves nothing t lists.
func Take(ctx context.Context, s *projector.Store, t Target, o TakeOptions) (Manifest, error) {
	return take(ctx, s, t, o, nil)
}

// take is Take; alter, when set, changes the manifest before the body is
// written (tests make snapshots that Restore must refuse).
func take(ctx context.Context, s *projector.Store, t Target, o TakeOptions, alter func(*Manifest)) (Manifest, error) {
	if s == nil || t == nil {
		return Manifest{}, errors.New("snapshot: take: a store and a target are required")
	}
	removeStaleCheckpoints(o.TempDir)
	tmp, err := os.MkdirTemp(o.TempDir, checkpointPrefix)
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: take: %w", err)
	}
	defer os.RemoveAll(tmp)
	cpDir := filepath.Join(tmp, "views")
	res, err := s.Checkpoint(cpDir)
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: take: %w", err)
	}
	files, err := checkpointFiles(cpDir)
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: take: %w", err)
	}
	created := time.Now().UTC().Truncate(time.Millisecond)
	m := Manifest{
		Name: snapshotName(projector.ViewsFormat, res.AppliedSeq, created), Version: Version,
		ViewsFormat: projector.ViewsFormat, Stream: o.Stream, AppliedSeq: res.AppliedSeq,
		ChainHead: res.ChainHead, Digest: res.Digest, Created: created, Host: o.Host, Files: files,
	}
	if alter != nil {
		alter(&m)
	}
	stepHook("checkpointed")
	if err := setBodySize(&m); err != nil {
		return Manifest{}, err
	}
	pr, pw := io.Pipe()
	wrote := make(chan error, 1)
	go func() {
		err := writeBody(ctx, pw, m, cpDir)
		pw.CloseWithError(err)
		wrote <- err
	}()
	err = t.Put(ctx, m, pr)
	// A Put that stopped reading early must not leave the writer blocked.
	pr.CloseWithError(errors.New("snapshot: the target stopped reading the body"))
	werr := <-wrote
	if err != nil {
		return Manifest{}, fmt.Errorf("snapshot: take: put %s to %s: %w", m.Name, t, err)
	}
	if werr != nil {
		return Manifest{}, fmt.Errorf("snapshot: take: %w", werr)
	}
	return m, nil
}

// checkpointPrefix starts the name of the directory Take makes its
// checkpoint in.
const checkpointPrefix = "cgledger-snapshot-"

// staleCheckpointAge is how old a checkpoint directory a killed Take left
// must be before the next Take removes it: a younger one may be another
// Take's, still running. Its sstables are hard links to the views', which
// would hold disk space forever.
const staleCheckpointAge = time.Hour

// removeStaleCheckpoints removes the checkpoint directories killed Takes
// left in dir ("" is os.TempDir).
func removeStaleCheckpoints(dir string) {
	if dir == "" {
		dir = os.TempDir()
	}
	matches, _ := filepath.Glob(filepath.Join(dir, checkpointPrefix+"*"))
	for _, p := range matches {
		if st, err := os.Stat(p); err == nil && st.IsDir() && time.Since(st.ModTime()) > staleCheckpointAge {
			_ = os.RemoveAll(p)
		}
	}
}
