package main

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

// goodFile is the report of an export of 42 entries whose chain holds.
var goodFile = stream.VerifyReport{FromSeq: 1, Count: 42, LastSeq: 42, Head: "h42", OK: true}

// TestFileVerdict: a file whose chain holds carries its digest; a broken
// one the first bad sequence and why, and no digest.
func TestFileVerdict(t *testing.T) {
	require.Equal(t, map[string]any{"file": "x.ndjson", "ok": true, "count": uint64(42), "last_seq": uint64(42), "chain_head": "h42", "digest": "d"},
		fileVerdict("x.ndjson", goodFile, "d"))

	broken := stream.VerifyReport{Count: 7, LastSeq: 7, Head: "h7", FirstBadSeq: 5, Reason: "link mismatch",
		Skips: []stream.NotedSkip{{Seq: 3, SkipSeq: 6, Reason: "corrupt"}}, SkipCount: 1}
	require.Equal(t, map[string]any{"file": "x.ndjson", "ok": false, "count": uint64(7), "last_seq": uint64(7), "chain_head": "h7",
		"first_bad_seq": uint64(5), "reason": "link mismatch", "skip_count": uint64(1), "skips": broken.Skips},
		fileVerdict("x.ndjson", broken, "d"))
}

// TestUnreadableVerdict: the reason is what is wrong with the file,
// without the prefixes of the functions that read it.
func TestUnreadableVerdict(t *testing.T) {
	inner := fmt.Errorf("%w: x.ndjson: line 1 is not a header", stream.ErrBadExport)
	err := fmt.Errorf("replay: %w", fmt.Errorf("import: %w", inner))
	require.Equal(t, map[string]any{"file": "x.ndjson", "ok": false, "reason": inner.Error()}, unreadableVerdict("x.ndjson", err))
}

// TestLiveVerdict: every answer of the live server about the file's last
// sequence, and the verdict (or the exit without one) it leads to.
func TestLiveVerdict(t *testing.T) {
	unreachable := fmt.Errorf("%w: dial tcp 127.0.0.1:8080: connection refused", errUnreachable)
	notServed := &apiError{Status: http.StatusNotFound, Err: protocol.Error{Code: protocol.CodeNotFound, Message: "not served",
		Violations: []protocol.Violation{{Field: "path", Code: protocol.VNotServed, Message: "no projector role"}}}}
	forbidden := &apiError{Status: http.StatusForbidden, Err: protocol.Error{Code: protocol.CodeForbidden, Message: "scope"}}
	missing := &apiError{Status: http.StatusNotFound, Err: protocol.Error{Code: protocol.CodeNotFound, Message: "no link at 42"}}
	const server = "http://live:8080"
	for _, c := range []struct {
		name    string
		ans     linkAnswer
		against string
		ok      bool
		want    map[string]any // the fields liveVerdict adds
		exit    int            // an exit without a verdict, when not 0
	}{
		{name: "matches", ans: linkAnswer{link: "h42", lastSeq: 42}, ok: true,
			want: map[string]any{"against": server, "live_link": "h42", "live": "matches"}},
		{name: "prefix", ans: linkAnswer{link: "h42", lastSeq: 50}, ok: true,
			want: map[string]any{"against": server, "live_link": "h42", "live": livePrefix, "live_last_seq": uint64(50)}},
		{name: "live end unknown", ans: linkAnswer{link: "h42"}, ok: true,
			want: map[string]any{"against": server, "live_link": "h42", "live": "matches at seq 42; the live ledger's last seq is unknown (its /readyz did not say)"}},
		{name: "differs", ans: linkAnswer{link: "other"}, ok: false,
			want: map[string]any{"against": server, "live_link": "other", "live": "DIFFERS", "first_bad_seq": uint64(42),
				"reason": "the file's chain head at seq 42 is h42, the live ledger's link there is other: an entry at or before seq 42 was changed after export (and the links recomputed), or the file comes from another ledger"}},
		{name: "default server unreachable", ans: linkAnswer{err: unreachable}, ok: true,
			want: map[string]any{"live": "not compared (" + unreachable.Error() + "; use --against URL)"}},
		{name: "--against unreachable", ans: linkAnswer{err: unreachable}, against: server, exit: exitUnreachable},
		{name: "not served", ans: linkAnswer{err: notServed}, exit: exitUnreachable},
		{name: "credential refused", ans: linkAnswer{err: forbidden}, exit: exitFor(forbidden)},
		{name: "no link there", ans: linkAnswer{err: missing}, ok: false,
			want: map[string]any{"against": server, "live": "DIFFERS", "first_bad_seq": uint64(42),
				"reason": "the live ledger has no chain link at the file's last seq 42 (" + missing.Error() + "): the file holds entries the ledger does not"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := c.ans
			a.server, a.refusal = server, refusalOf(a.err)
			body := fileVerdict("x.ndjson", goodFile, "d")
			ok, exit := liveVerdict(body, goodFile, a, c.against)
			if c.exit != 0 {
				require.NotNil(t, exit)
				require.Equal(t, c.exit, exit.code)
				require.Contains(t, exit.msg, a.err.Error())
				require.False(t, ok)
				return
			}
			require.Nil(t, exit)
			require.Equal(t, c.ok, ok)
			expect := fileVerdict("x.ndjson", goodFile, "d")
			for k, v := range c.want {
				expect[k] = v
			}
			require.Equal(t, expect, body)
		})
	}
}

// TestLinkAnswerAgrees: the live end is asked only when the links agree.
func TestLinkAnswerAgrees(t *testing.T) {
	require.True(t, linkAnswer{link: "h42"}.agrees(goodFile))
	require.False(t, linkAnswer{link: "h41"}.agrees(goodFile))
	require.False(t, linkAnswer{link: "h42", refusal: linkMissing}.agrees(goodFile))
}

// TestServerVerdict: a running server's verification, with its views'
// digest and how far they are applied.
func TestServerVerdict(t *testing.T) {
	rep := stream.VerifyReport{Count: 9, LastSeq: 9, Head: "h9", OK: true}
	require.Equal(t, map[string]any{"server": "http://s", "ok": true, "count": uint64(9), "last_seq": uint64(9), "chain_head": "h9",
		"views_applied_seq": uint64(9), "views_chain_head": "h9", "digest": "dd"}, serverVerdict("http://s", rep, 9, "dd", "h9"))
	rep.OK, rep.FirstBadSeq, rep.Reason = false, 4, "bad link"
	body := serverVerdict("http://s", rep, 9, "dd", "h9")
	require.Equal(t, uint64(4), body["first_bad_seq"])
	require.Equal(t, "bad link", body["reason"])
}

// TestReportSaysTheVerdict: the first line of the text report names the
// verdict, and the exit code follows it.
func TestReportSaysTheVerdict(t *testing.T) {
	var buf bytes.Buffer
	old := stdout
	stdout = &buf
	t.Cleanup(func() { stdout = old })
	for _, c := range []struct {
		body  map[string]any
		ok    bool
		first string
		code  int
	}{
		{map[string]any{"file": "x"}, true, "chain:      OK", exitOK},
		{map[string]any{"live": "DIFFERS", "reason": "r", "first_bad_seq": uint64(42)}, false, "chain:      consistent on its own, but NOT the live ledger's: r", exitFailed},
		{map[string]any{"reason": "not a header"}, false, "chain:      unreadable: not a header", exitFailed},
		{map[string]any{"reason": "link mismatch", "first_bad_seq": uint64(5)}, false, "chain:      BROKEN at seq 5: link mismatch", exitFailed},
	} {
		buf.Reset()
		require.Equal(t, c.code, report(false, c.body, c.ok))
		first, _, _ := bytes.Cut(buf.Bytes(), []byte("\n"))
		require.Equal(t, c.first, string(first))
	}
}
