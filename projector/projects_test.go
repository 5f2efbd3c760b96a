package projector

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"sort"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// projectsLedger writes the standard scenario (project proj) and entries
// that bring projects in through every kind of project-scoped row: a
// roster entry only (crew), a tool registration only (toolbox), an
// unrecognized message placed in a turn by its headers (stray), a call
// (beta), and a rejection naming no valid project (the unrouted "_", which
// is not a project).
func projectsLedger(t *testing.T, e *ledgertest.Env) {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 6)
	_, err := e.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "crew", AgentID: "a1", WorkerTarget: "w1"})
	require.NoError(t, err)
	_, err = e.L.RegisterToolYAML(ctx, "toolbox", []byte("tool_name: hammer\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.hammer\nafter_execution: suspend\n"))
	require.NoError(t, err)
	_, err = e.JS.PublishMsg(ctx, &nats.Msg{Subject: "cg.not.in.the.grammar", Data: []byte(`{}`),
		Header: nats.Header{protocol.HeaderProjectID: {"stray"}, protocol.HeaderAgentTurnID: {"t1"}}})
	require.NoError(t, err)
	e.Complete(t, ledgertest.Call{Project: "beta", Channel: "main", Agent: "ann", Turn: "t1", ID: "c1", Epoch: 1, Tool: "echo"}, protocol.StatusSuccess, `{}`)
	_, err = e.L.PutCard(ctx, protocol.Card{ProjectID: "not.valid", CardID: "x"})
	require.Error(t, err)
}

func catchUp(t *testing.T, e *ledgertest.Env, s *Store, batch int) {
	t.Helper()
	p, err := New(s, e.JS, Config{BatchSize: batch})
	require.NoError(t, err)
	require.NoError(t, p.CatchUp(ledgertest.Ctx(t)))
}

func openTestStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := OpenStore(dir, StoreOptions{})
	require.NoError(t, err)
	return s
}

func storeDigest(t *testing.T, s *Store) string {
	t.Helper()
	d, err := s.Digest()
	require.NoError(t, err)
	return d
}

// errNotNow is what a test's BeforeRebuild answers to keep a store as it is.
var errNotNow = errors.New("not now")

// refusedRebuild opens dir with a BeforeRebuild that refuses, and returns
// what it was told (nil when it was not called).
func refusedRebuild(t *testing.T, dir string) *FormatChange {
	t.Helper()
	var told *FormatChange
	s, err := OpenStore(dir, StoreOptions{BeforeRebuild: func(fc FormatChange) error { told = &fc; return errNotNow }})
	if told == nil {
		require.NoError(t, err)
		require.NoError(t, s.Close())
		return nil
	}
	require.ErrorIs(t, err, errNotNow)
	return told
}

// rebuiltApplied is the ledger stream's last sequence.
func rebuiltApplied(t *testing.T, e *ledgertest.Env) uint64 {
	t.Helper()
	s, err := e.JS.Stream(ledgertest.Ctx(t), e.L.StreamName())
	require.NoError(t, err)
	return s.CachedInfo().State.LastSeq
}

// rebuiltDigest projects the whole ledger into a fresh store.
func rebuiltDigest(t *testing.T, e *ledgertest.Env) string {
	t.Helper()
	s := openTestStore(t, filepath.Join(t.TempDir(), "fresh"))
	defer s.Close()
	catchUp(t, e, s, 1000)
	return storeDigest(t, s)
}

// TestAnOlderViewsFormatIsRebuilt checks that a store of another views
// format (none: written before formats; an older number; or one a release
// of format 1 wrote to after format 2 did) is emptied when opened and comes
// out byte for byte as a rebuild from sequence 1, that a store of this
// format is opened as it is, and that applying goes on from the project
// set loaded at open (a project seen before is not written again, a new
// one is).
func TestAnOlderViewsFormatIsRebuilt(t *testing.T) {
	e := ledgertest.New(t)
	projectsLedger(t, e)

	dir := filepath.Join(t.TempDir(), "views")
	require.Nil(t, refusedRebuild(t, dir), "no store yet: nothing to rebuild")
	s := openTestStore(t, dir)
	require.Nil(t, s.FormatChange(), "a fresh store is stamped, not rebuilt")
	catchUp(t, e, s, 3)
	want := rebuiltDigest(t, e)
	require.Equal(t, want, storeDigest(t, s), "a small batch size writes the same views as one batch")

	q := NewQueries(s)
	page, err := q.Projects(AsOf{}, "", 0)
	require.NoError(t, err)
	var names []string
	for _, p := range page.Items {
		names = append(names, p.ProjectID)
		require.NotZero(t, p.FirstSeq)
		require.False(t, p.FirstTime.IsZero() && p.ProjectID != "stray", "%s has its first entry's time", p.ProjectID)
	}
	require.Equal(t, []string{"beta", "crew", "proj", "stray", "toolbox"}, names)
	require.NoError(t, s.Close())

	s = openTestStore(t, dir)
	require.Nil(t, s.FormatChange(), "a store of this format is kept")
	require.Equal(t, want, storeDigest(t, s))

	for _, c := range []struct {
		name   string
		mangle func(db *pebble.DB) error
		from   int
	}{
		{"no format row", func(db *pebble.DB) error { return db.Delete(metaFormat, pebble.Sync) }, 0},
		{"format 1", func(db *pebble.DB) error { return db.Set(metaFormat, []byte("1"), pebble.Sync) }, 1},
		{"format 2 (no open rows)", func(db *pebble.DB) error { return db.Set(metaFormat, []byte("2"), pebble.Sync) }, 2},
		{"written by format 1 since", func(db *pebble.DB) error {
			return db.Set(metaProjects, binary.BigEndian.AppendUint64(nil, 7), pebble.Sync)
		}, ViewsFormat},
	} {
		require.NoError(t, c.mangle(s.db), c.name)
		require.NoError(t, s.Close())
		for range 2 {
			fc := refusedRebuild(t, dir)
			require.NotNil(t, fc, c.name)
			require.Equal(t, [2]uint64{uint64(c.from), rebuiltApplied(t, e)}, [2]uint64{uint64(fc.From), fc.Applied}, "%s: refused, and left as it was", c.name)
			require.NotEmpty(t, fc.Reason)
		}
		s = openTestStore(t, dir)
		require.NotNil(t, s.FormatChange(), c.name)
		require.Equal(t, [2]uint64{uint64(c.from), rebuiltApplied(t, e)}, [2]uint64{uint64(s.FormatChange().From), s.FormatChange().Applied}, c.name)
		applied, err := s.Applied()
		require.NoError(t, err)
		require.Zero(t, applied, "%s: emptied", c.name)
		catchUp(t, e, s, 1000)
		require.Equal(t, want, storeDigest(t, s), "%s: rebuilt", c.name)
	}

	// A store of format 1: Pebble's default comparer, as format 1 used.
	require.NoError(t, s.Close())
	old := filepath.Join(t.TempDir(), "views-format-1")
	db, err := pebble.Open(old, &pebble.Options{})
	require.NoError(t, err)
	require.NoError(t, db.Set(metaApplied, checkpoint{Applied: 5}.encode(), pebble.Sync))
	require.NoError(t, db.Set(key(tagEntry).u64(1), []byte("a format 1 row"), pebble.Sync))
	require.NoError(t, db.Close())
	for range 2 {
		fc := refusedRebuild(t, old)
		require.NotNil(t, fc)
		require.Equal(t, [2]uint64{1, 5}, [2]uint64{uint64(fc.From), fc.Applied}, "format 1 refused, and left as it was")
	}
	s = openTestStore(t, old)
	require.Equal(t, [2]uint64{1, 5}, [2]uint64{uint64(s.FormatChange().From), s.FormatChange().Applied})
	applied, err := s.Applied()
	require.NoError(t, err)
	require.Zero(t, applied, "emptied")
	catchUp(t, e, s, 1000)
	require.Equal(t, want, storeDigest(t, s), "format 1: rebuilt")
	require.NoError(t, s.Close())
	require.Nil(t, refusedRebuild(t, old), "nothing to do for a store of this format")
	s = openTestStore(t, old)
	require.Nil(t, s.FormatChange(), "rebuilt once")

	// Applying goes on from the set loaded at open.
	require.NoError(t, s.Close())
	s = openTestStore(t, dir)
	ctx := ledgertest.Ctx(t)
	e.Complete(t, ledgertest.Call{Project: "beta", Channel: "main", Agent: "ann", Turn: "t2", ID: "c2", Epoch: 1, Tool: "echo"}, protocol.StatusSuccess, `{}`)
	_, err = e.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "late", AgentID: "a1", WorkerTarget: "w1"})
	require.NoError(t, err)
	catchUp(t, e, s, 2)
	require.Equal(t, rebuiltDigest(t, e), storeDigest(t, s), "applied after a reopen")
	require.NoError(t, s.Close())
}

func TestProjectRowTagsAgree(t *testing.T) {
	for _, tag := range projectRowTags {
		require.True(t, isProjectRowTag([]byte(tag)), tag)
	}
	for _, tag := range []string{tagMeta, tagEntry, tagLink, tagTime, tagStory, tagIndex, tagConsumed, tagPending, tagUnrec, tagSkipped, tagSkip, tagProject, tagOpen, tagLost} {
		require.False(t, isProjectRowTag([]byte(tag)), tag)
	}
}

// TestProjectsAsOfAndPaging checks that a project is listed as of S exactly
// when its first entry is at or before S, and that pages of any size cover
// the listing once, in order.
func TestProjectsAsOfAndPaging(t *testing.T) {
	e := ledgertest.New(t)
	projectsLedger(t, e)
	s := openTestStore(t, filepath.Join(t.TempDir(), "views"))
	defer s.Close()
	catchUp(t, e, s, 16)
	q := NewQueries(s)
	all, err := q.Projects(AsOf{}, "", 0)
	require.NoError(t, err)
	require.Empty(t, all.NextCursor)
	first, err := firstSeqs(s.db)
	require.NoError(t, err)
	require.Len(t, all.Items, len(first))
	for _, p := range all.Items {
		require.Equal(t, first[p.ProjectID], p.FirstSeq, p.ProjectID)
		for _, seq := range []uint64{p.FirstSeq - 1, p.FirstSeq} {
			if seq == 0 {
				continue // AsOf{Seq: 0} is the latest
			}
			page, err := q.Projects(AsOf{Seq: seq}, "", MaxLimit)
			require.NoError(t, err)
			listed := false
			for _, it := range page.Items {
				listed = listed || it.ProjectID == p.ProjectID
			}
			require.Equal(t, seq >= p.FirstSeq, listed, "%s as of %d (first seq %d)", p.ProjectID, seq, p.FirstSeq)
		}
		if !p.FirstTime.IsZero() {
			page, err := q.Projects(AsOf{Time: p.FirstTime}, "", MaxLimit)
			require.NoError(t, err)
			require.GreaterOrEqual(t, page.AsOfSeq, p.FirstSeq, "as of the first entry's time")
		}
	}
	for _, limit := range []int{1, 2, 3} {
		var got []string
		cursor := ""
		for {
			page, err := q.Projects(AsOf{}, cursor, limit)
			require.NoError(t, err)
			require.LessOrEqual(t, len(page.Items), limit)
			for _, it := range page.Items {
				got = append(got, it.ProjectID)
			}
			if page.NextCursor == "" {
				break
			}
			cursor = page.NextCursor
		}
		require.True(t, sort.StringsAreSorted(got))
		require.Len(t, got, len(all.Items), "limit %d", limit)
	}
	// The last page of an as-of listing has no cursor when later projects
	// are not yet listed.
	crew := all.Items[1]
	require.Equal(t, "crew", crew.ProjectID)
	page, err := q.Projects(AsOf{Seq: crew.FirstSeq}, "", 2)
	require.NoError(t, err)
	require.Len(t, page.Items, 2, "crew and proj exist as of crew's first entry")
	require.Empty(t, page.NextCursor, "nothing else exists then")
	_, err = q.Projects(AsOf{}, "bm90IGEgY3Vyc29y", 0)
	require.ErrorIs(t, err, protocol.ErrBadRequest)
}
