package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// largestMember reads the body of m from tg and finds the largest of its
// files whose name has the suffix: its index in m.Files and its offset in
// the body. It also returns the size of the first member (the manifest).
func largestMember(t *testing.T, ctx context.Context, tg Target, m Manifest, suffix string) (body []byte, at int, off, manifestSize int64) {
	t.Helper()
	r, err := tg.Open(ctx, m.Name)
	require.NoError(t, err)
	body, err = io.ReadAll(r)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	raw, err := json.Marshal(m)
	require.NoError(t, err)
	manifestSize = memberSize(int64(len(raw)))
	at, pos := -1, manifestSize
	for i, f := range m.Files {
		if strings.HasSuffix(f.Name, suffix) && (at < 0 || f.Size > m.Files[at].Size) {
			at, off = i, pos+tarBlock
		}
		pos += memberSize(f.Size)
	}
	require.GreaterOrEqual(t, at, 0)
	require.Positive(t, m.Files[at].Size)
	return body, at, off, manifestSize
}

// tamper replaces the body of m in t with one whose largest file has a
// byte flipped in the middle, under the same manifest.
func tamper(t *testing.T, ctx context.Context, tg Target, m Manifest) {
	t.Helper()
	body, at, off, _ := largestMember(t, ctx, tg, m, "")
	body[off+m.Files[at].Size/2] ^= 0x20
	require.NoError(t, tg.Delete(ctx, m.Name))
	require.NoError(t, tg.Put(ctx, m, bytes.NewReader(body)))
}

// later makes a manifest change give a distinct, newer name.
func later(ms int64, change func(*Manifest)) func(*Manifest) {
	return func(m *Manifest) {
		change(m)
		m.Created = m.Created.Add(time.Duration(ms) * time.Millisecond)
		m.Name = snapshotName(m.ViewsFormat, m.AppliedSeq, m.Created)
	}
}

// Every bad snapshot is refused with its reason, logged, and the older good
// one is used; once no snapshot passes, Restore says why for each.
func TestRestoreRefusesBadSnapshotsAndUsesTheNextGoodOne(t *testing.T) {
	e := ledgertest.New(t)
	other := ledgertest.New(t) // another ledger: same stream name, other history
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 2)
	early := builtViews(t, ctx, e) // left at s1
	s1, err := early.Applied()
	require.NoError(t, err)
	e.WriteCalls(t, ctx, 40, 2)
	live := builtViews(t, ctx, e)
	last, err := live.Applied()
	require.NoError(t, err)

	other.Scenario(t, 6)
	otherViews := builtViews(t, ctx, other)
	otherSeq, err := otherViews.Applied()
	require.NoError(t, err)
	require.Less(t, s1, otherSeq, "the other ledger's snapshot must sort before the good one")
	require.LessOrEqual(t, otherSeq, last, "and the stream must reach its sequence")
	// Ahead of the stream: the other ledger, once longer than this one.
	other.WriteCalls(t, ctx, 60, 2)
	otherAhead := builtViews(t, ctx, other)

	for kind, tg := range targets(t, ctx, e, "snaps_refuse") {
		t.Run(kind, func(t *testing.T) {
			opts := TakeOptions{Stream: ledgerStream}
			good, err := take(ctx, early, tg, opts, nil)
			require.NoError(t, err)
			require.Equal(t, s1, good.AppliedSeq)
			fromOther, err := Take(ctx, otherViews, tg, opts)
			require.NoError(t, err)
			flipped, err := Take(ctx, live, tg, opts)
			require.NoError(t, err)
			tamper(t, ctx, tg, flipped)
			format, err := take(ctx, live, tg, opts, later(1, func(m *Manifest) { m.ViewsFormat = projector.ViewsFormat - 1 }))
			require.NoError(t, err)
			version, err := take(ctx, live, tg, opts, later(2, func(m *Manifest) { m.Version = Version + 1 }))
			require.NoError(t, err)
			stream, err := take(ctx, live, tg, opts, later(3, func(m *Manifest) { m.Stream = "OTHER" }))
			require.NoError(t, err)
			ahead, err := Take(ctx, otherAhead, tg, opts)
			require.NoError(t, err)
			require.Greater(t, ahead.AppliedSeq, last)

			got, refusals, dir := restoreLogged(t, ctx, e, tg)
			require.Equal(t, good.Name, got.Name, "the older good snapshot is used")
			want := map[string]string{
				ahead.Name:     "cannot continue from the snapshot's sequence",
				flipped.Name:   "",
				format.Name:    "views format",
				version.Name:   "snapshot layout version",
				stream.Name:    `taken from stream "OTHER"`,
				fromOther.Name: "chain check",
			}
			require.Len(t, refusals, len(want), "%v", refusals)
			for name, reason := range want {
				require.Contains(t, refusals, name)
				require.Contains(t, refusals[name], reason)
			}
			// A flipped byte fails the file's SHA-256 (directory) or the
			// object store's own digest as the body is read.
			require.Regexp(t, "sha256|digest", refusals[flipped.Name])

			d, err := openViews(t, dir).Digest()
			require.NoError(t, err)
			require.Equal(t, good.Digest, d)
		})
	}

	// Once the stream holds nothing up to the good snapshot's sequence (its retention let it go)
	// but all that follows, nothing ties the snapshot to this ledger: refused (another ledger's
	// snapshot would pass every other check).
	s, err := e.JS.Stream(ctx, ledgerStream)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs, cfg.Discard = int64(last+1-s1), jetstream.DiscardOld
	_, err = e.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	_, err = e.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: "untied", WorkerTarget: "worker-untied"})
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, s1+1, info.State.FirstSeq, "the stream holds exactly what follows the snapshot")
	untied, err := NewDir(filepath.Join(t.TempDir(), "untied"))
	require.NoError(t, err)
	_, err = Take(ctx, early, untied, TakeOptions{Stream: ledgerStream})
	require.NoError(t, err)
	_, err = Restore(ctx, untied, filepath.Join(t.TempDir(), "views"), restoreOpts(e))
	var untiedErr *RefusedError
	require.True(t, errors.As(err, &untiedErr), "%v", err)
	require.Contains(t, untiedErr.Refused[0].Reason, "cannot be tied to this ledger")

	// Once the stream no longer holds what follows the good snapshot (its retention let it go), no
	// snapshot passes: each is listed with its reason.
	last = info.State.LastSeq
	// A retention limit (the stream denies purges) drops the entries after s1.
	cfg.MaxMsgs, cfg.Discard = int64(last-s1-5), jetstream.DiscardOld
	_, err = e.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	// The limit applies as the next entry is stored.
	_, err = e.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: "late", WorkerTarget: "worker-late"})
	require.NoError(t, err)
	info, err = s.Info(ctx)
	require.NoError(t, err)
	require.Greater(t, info.State.FirstSeq, s1+1)
	d, err := NewDir(filepath.Join(t.TempDir(), "one"))
	require.NoError(t, err)
	good, err := Take(ctx, early, d, TakeOptions{Stream: ledgerStream})
	require.NoError(t, err)
	_, err = Restore(ctx, d, filepath.Join(t.TempDir(), "views"), restoreOpts(e))
	require.ErrorIs(t, err, ErrNoSnapshot)
	var refused *RefusedError
	require.True(t, errors.As(err, &refused))
	require.Equal(t, []Refusal{{Name: good.Name, Reason: refused.Refused[0].Reason}}, refused.Refused)
	require.Contains(t, refused.Refused[0].Reason, "cannot continue from the snapshot's sequence")
}

// restoreLogged restores from tg into a new views directory, which it
// returns with the restored manifest and the refusals the restore logged.
func restoreLogged(t *testing.T, ctx context.Context, e *ledgertest.Env, tg Target) (Manifest, map[string]string, string) {
	t.Helper()
	var logs bytes.Buffer
	o := restoreOpts(e)
	o.Log = slog.New(slog.NewJSONHandler(&logs, nil))
	dir := filepath.Join(t.TempDir(), "views")
	got, err := Restore(ctx, tg, dir, o)
	require.NoError(t, err)
	return got, refusalsLogged(t, &logs), dir
}

// refusalsLogged reads the JSON log lines of refused snapshots: name -> reason.
func refusalsLogged(t *testing.T, logs *bytes.Buffer) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Msg      string `json:"msg"`
			Snapshot string `json:"snapshot"`
			Reason   string `json:"reason"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if rec.Msg == "views snapshot refused" {
			out[rec.Snapshot] = rec.Reason
		}
	}
	return out
}

// corruptUnderMatchingHashes flips a byte a third of the way into the
// largest sstable of m's body and writes that file's new SHA-256 into both
// manifests, so the body passes every file check and only a read of the
// block finds it.
func corruptUnderMatchingHashes(t *testing.T, ctx context.Context, tg Target, m Manifest) {
	t.Helper()
	body, at, off, manifestSize := largestMember(t, ctx, tg, m, ".sst")
	big := m.Files[at]
	body[off+big.Size/3] ^= 0x20
	sum := sha256.Sum256(body[off : off+big.Size])
	fresh := hex.EncodeToString(sum[:])
	inner := body[:manifestSize]
	require.Equal(t, 1, bytes.Count(inner, []byte(big.SHA256)))
	copy(inner, bytes.Replace(inner, []byte(big.SHA256), []byte(fresh), 1))
	m.Files = append([]File(nil), m.Files...)
	m.Files[at].SHA256 = fresh
	require.NoError(t, tg.Delete(ctx, m.Name))
	require.NoError(t, tg.Put(ctx, m, bytes.NewReader(body)))
}

// A snapshot with a corrupt sstable under hashes that match it (damaged
// before it was hashed, or written so) passes every file check; the
// digest's read of the block finds the bad checksum. It is refused with
// that reason and the older good snapshot is used: Pebble's default for
// corruption, a fatal log, would have ended the process on every start.
func TestRestoreRefusesACorruptSSTableUnderMatchingHashes(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 2)
	early := builtViews(t, ctx, e)
	e.WriteCalls(t, ctx, 40, 2)
	live := builtViews(t, ctx, e)
	for kind, tg := range targets(t, ctx, e, "snaps_corrupt") {
		t.Run(kind, func(t *testing.T) {
			good, err := Take(ctx, early, tg, TakeOptions{Stream: ledgerStream})
			require.NoError(t, err)
			bad, err := Take(ctx, live, tg, TakeOptions{Stream: ledgerStream})
			require.NoError(t, err)
			corruptUnderMatchingHashes(t, ctx, tg, bad)

			got, refusals, dir := restoreLogged(t, ctx, e, tg)
			require.Equal(t, good.Name, got.Name, "the older good snapshot is used")
			require.Len(t, refusals, 1, "%v", refusals)
			require.Contains(t, refusals[bad.Name], "checksum mismatch")
			require.NotContains(t, refusals[bad.Name], "failed write", "corruption is not a write that failed")
			d, err := openViews(t, dir).Digest()
			require.NoError(t, err)
			require.Equal(t, good.Digest, d)
		})
	}
}
