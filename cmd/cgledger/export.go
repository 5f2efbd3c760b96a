package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/cgledger/cgledger/httpclient"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/replay"
	"github.com/cgledger/cgledger/stream"
)

func export(args []string) int {
	fs := newFlagSet("export", "export --out FILE [--from-seq N]",
		`Write the ledger of a running server, from sequence N (default 1) to its current end, as
a versioned JSON Lines export file (docs/tamper-evidence.md): a header, one line per entry
with its sequence, subject, headers, data, time and hash-chain link, and a trailer. It is
read over the HTTP API (GET /v1/export) and needs an auditor or admin credential of every
project ("*"), such as the embedded admin credential.`)
	var cf clientFlags
	cf.register(fs)
	out := fs.String("out", "", "file to write (required; - for standard output)")
	from := fs.Uint64("from-seq", 1, "first sequence to export")
	quiet := fs.Bool("quiet", false, "print no progress")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	if *out == "" {
		return failf(exitUsage, "export: --out is required")
	}
	if *from == 0 {
		return failf(exitUsage, "export: --from-seq must be at least 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	api, err := cf.api()
	if err != nil {
		return failf(exitUsage, "export: %v", err)
	}
	body, err := api.Export(ctx, *from)
	var te *httpclient.TransportError
	switch {
	case errors.As(err, &te):
		return failf(exitUnreachable, "export: cannot reach HTTP at %s (from %s): %v; is `cgledger serve` running there? Set --server or CGLEDGER_SERVER", cf.server, cf.from("server"), te.Err)
	case err != nil:
		return failf(exitFailed, "export: %v", cf.httpErr(err))
	}
	defer body.Close()
	if *out == "-" {
		if _, err := io.Copy(os.Stdout, body); err != nil {
			return failf(exitFailed, "export: transfer interrupted: %v", err)
		}
		return exitOK
	}
	// Write beside the target and verify before renaming: a transfer cut
	// short must not leave behind something that looks like an export.
	partial := *out + ".partial"
	f, err := os.Create(partial)
	if err != nil {
		return failf(exitUsage, "export: %v", err)
	}
	defer os.Remove(partial)
	bw := bufio.NewWriter(f)
	pr := newProgress("export", *quiet)
	total := uint64(0)
	if last := cf.lastSeq(ctx); last >= *from {
		total = last - *from + 1
	}
	_, err = io.Copy(bw, &lineCounter{r: body, each: func(lines uint64) {
		if lines > 1 { // the header line is not an entry, nor is the trailer
			done := lines - 1
			if total > 0 {
				done = min(done, total)
			}
			pr.update(done, total, "entries", 0)
		}
	}})
	pr.done()
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return failf(exitFailed, "export: transfer interrupted: %v", err)
	}
	rf, err := os.Open(partial)
	if err != nil {
		return failf(exitFailed, "export: %v", err)
	}
	rep, err := stream.VerifyExport(bufio.NewReader(rf))
	rf.Close()
	if err == nil && !rep.OK {
		err = fmt.Errorf("chain broken at seq %d: %s", rep.FirstBadSeq, rep.Reason)
	}
	if err != nil {
		return failf(exitFailed, "export: received file does not verify: %v", err)
	}
	if err := os.Rename(partial, *out); err != nil {
		return failf(exitUsage, "export: %v", err)
	}
	if cf.asJSON {
		printJSON(map[string]any{"file": *out, "count": rep.Count, "last_seq": rep.LastSeq, "chain_head": rep.Head})
	} else {
		fmt.Fprintf(stdout, "exported %d entries (through seq %d) to %s\nchain head: %s\n", rep.Count, rep.LastSeq, *out, rep.Head)
	}
	return exitOK
}

func replayCmd(args []string) int {
	fs := newFlagSet("replay", "replay FILE [--expect DIGEST] [--json]",
		`Start a fresh embedded JetStream server in a temporary directory, load the export file,
run the projector, and print the view digest and hash-chain head. Replays are deterministic:
the same file gives the same digest every time, on any machine. With --expect (another
build's digest), exit 0 when the two builds agree and 1 when they differ.`)
	asJSON := fs.Bool("json", false, "print JSON")
	expect := fs.String("expect", "", "digest to compare with")
	quiet := fs.Bool("quiet", false, "print no progress")
	pos, code, ok := parseOrExit(fs, args, 1)
	if !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if f, err := os.Open(pos[0]); err != nil {
		return failf(exitUsage, "replay: %v", err)
	} else {
		f.Close()
	}
	pr := newProgress("replay", *quiet)
	res, err := replay.Run(ctx, pos[0], replay.Options{Progress: replayProgress(pr)})
	pr.done()
	if err != nil {
		// replay.Run names itself.
		return failf(exitFailed, "%v", err)
	}
	agree := *expect == "" || *expect == res.Digest
	if *asJSON {
		body := map[string]any{"entries": res.Entries, "applied_seq": res.AppliedSeq, "digest": res.Digest, "chain_head": res.ChainHead}
		if *expect != "" {
			body["expected"], body["agree"] = *expect, agree
		}
		printJSON(body)
	} else {
		fmt.Fprintf(stdout, "entries:    %d\ndigest:     %s\nchain head: %s\n", res.Entries, res.Digest, res.ChainHead)
		if *expect != "" {
			if agree {
				fmt.Fprintln(stdout, "builds agree: digest matches --expect")
			} else {
				fmt.Fprintf(stdout, "builds DIFFER: expected %s\n", *expect)
			}
		}
	}
	if !agree {
		return exitFailed
	}
	return exitOK
}

func verify(args []string) int {
	fs := newFlagSet("verify", "verify [FILE] [--against URL] [--json]",
		`Check the ledger's hash chain. With FILE (an export), recompute the chain from the file and
name the first sequence that does not match, then replay it to print the view digest, and compare
the file's chain head with the live ledger's link at the file's last sequence (GET /v1/chain/SEQ):
a file whose every link was recomputed after an edit is consistent alone but differs from the live
chain. A file whose links agree is "live: matches" when it ends where the live ledger does (its
/readyz last_seq), and "live: prefix of the live ledger", with live_last_seq, when the live ledger
goes on past it (exit 0 for both). --against URL names the live server (it must answer); without it the --server default is
tried, and the comparison is reported as skipped when it cannot be reached. Without FILE, ask the
running server (GET /v1/verify and /v1/digest): it recomputes the chain from the live stream
against the links its views recorded. Exit 1 when verification fails.`)
	var cf clientFlags
	cf.register(fs)
	against := fs.String("against", "", "HTTP base URL of the live server to compare an export's chain head with (default: --server, when reachable)")
	quiet := fs.Bool("quiet", false, "print no progress")
	pos, code, ok := parseOrExit(fs, args)
	if !ok {
		return code
	}
	if len(pos) > 1 {
		return failf(exitUsage, "verify: at most one FILE")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if len(pos) == 1 {
		// A file that cannot be read as an export is a verdict too: the
		// same report (and --json body) as a broken chain, exit 1.
		unreadable := func(err error) int {
			return report(cf.asJSON, unreadableVerdict(pos[0], err), false)
		}
		from, err := exportFromSeq(pos[0])
		if errors.Is(err, stream.ErrBadExport) {
			return unreadable(err)
		}
		if err != nil {
			return failf(exitFor(err), "verify: %v", err)
		}
		pr := newProgress("verify", *quiet)
		var rep stream.VerifyReport
		digest := ""
		if from == 1 {
			// One pass: the replay verifies the chain as it imports, and
			// projects for the view digest.
			res, err := replay.Run(ctx, pos[0], replay.Options{Progress: replayProgress(pr)})
			pr.done()
			if errors.Is(err, stream.ErrBadExport) {
				return unreadable(err)
			}
			if res == nil || (err != nil && res.File.FirstBadSeq == 0) {
				return failf(exitFailed, "verify: %v", err)
			}
			rep, digest = res.File, res.Digest
		} else {
			// Views are built from sequence 1: a partial export has a
			// chain to check but no digest of its own.
			f, err := os.Open(pos[0])
			if err != nil {
				return failf(exitUsage, "verify: %v", err)
			}
			st, _ := f.Stat()
			cr := &countingFile{f: f, each: func(n int64) { pr.update(uint64(n), uint64(st.Size()), "bytes checked", 0) }}
			rep, err = stream.VerifyExport(bufio.NewReaderSize(cr, 1<<20))
			pr.done()
			f.Close()
			if errors.Is(err, stream.ErrBadExport) {
				return unreadable(err)
			}
			if err != nil {
				return failf(exitFailed, "verify: %v", err)
			}
			digest = "n/a (partial export from seq " + fmt.Sprint(rep.FromSeq) + ")"
		}
		body := fileVerdict(pos[0], rep, digest)
		ok := rep.OK
		if ok && rep.LastSeq > 0 {
			live := cf
			if *against != "" {
				live.server = *against
				// Where the credential came from stays as the flags and
				// settings said: only the server is --against's.
				src := map[string]string{}
				for k, v := range cf.source {
					src[k] = v
				}
				if cf.from("creds") != "the default" {
					src["creds"] = cf.from("creds")
				}
				src["server"] = "flag --against"
				live.source = src
				live.fs = nil
			}
			var link projector.ChainLink
			api, err := live.api()
			if err == nil {
				link, err = api.ChainLink(ctx, rep.LastSeq)
				err = live.httpErr(err)
			}
			ans := linkAnswer{server: live.server, link: link.Link, err: err, refusal: refusalOf(err)}
			if ans.agrees(rep) {
				ans.lastSeq = live.lastSeq(ctx)
			}
			var exit *verdictExit
			if ok, exit = liveVerdict(body, rep, ans, *against); exit != nil {
				return failf(exit.code, "%s", exit.msg)
			}
		}
		return report(cf.asJSON, body, ok)
	}
	api, err := cf.api()
	if err != nil {
		return failf(exitFor(err), "verify: %v", err)
	}
	served, err := api.Verify(ctx)
	if err != nil {
		err = cf.httpErr(err)
		return failf(exitFor(err), "verify: %v", err)
	}
	rep := served
	d, err := api.Digest(ctx)
	if err != nil {
		err = cf.httpErr(err)
		return failf(exitFor(err), "verify: %v", err)
	}
	return report(cf.asJSON, serverVerdict(cf.server, rep, d.AppliedSeq, d.Digest, d.ChainHead), rep.OK)
}

// noted adds the unrecognized and skipped entries a verification named.
func noted(body map[string]any, rep stream.VerifyReport) {
	if rep.UnrecognizedCount > 0 {
		body["unrecognized_count"], body["unrecognized"] = rep.UnrecognizedCount, rep.Unrecognized
	}
	if rep.SkipCount > 0 {
		body["skip_count"], body["skips"] = rep.SkipCount, rep.Skips
	}
}

func report(asJSON bool, body map[string]any, ok bool) int {
	if asJSON {
		printJSON(body)
	} else {
		switch {
		case ok:
			fmt.Fprintln(stdout, "chain:      OK")
		case body["live"] == "DIFFERS":
			// The file's own chain holds: it differs from the live ledger
			// somewhere at or before its last sequence.
			fmt.Fprintf(stdout, "chain:      consistent on its own, but NOT the live ledger's: %v\n", body["reason"])
		case body["first_bad_seq"] == nil:
			// Not an export file that can be read: no chain to speak of.
			fmt.Fprintf(stdout, "chain:      unreadable: %v\n", body["reason"])
		default:
			fmt.Fprintf(stdout, "chain:      BROKEN at seq %v: %v\n", body["first_bad_seq"], body["reason"])
		}
		for _, k := range []string{"file", "server", "count", "last_seq", "chain_head", "live", "live_last_seq", "against", "live_link", "views_applied_seq", "views_chain_head", "digest", "unrecognized_count", "skip_count"} {
			if v, found := body[k]; found {
				fmt.Fprintf(stdout, "%-11s %v\n", k+":", v)
			}
		}
		if list, ok := body["unrecognized"].([]stream.NotedEntry); ok {
			for _, e := range list {
				fmt.Fprintf(stdout, "  unrecognized seq %d %s: %s (%s)\n", e.Seq, e.Subject, e.Reason, e.Code)
			}
		}
		if list, ok := body["skips"].([]stream.NotedSkip); ok {
			for _, e := range list {
				fmt.Fprintf(stdout, "  skipped seq %d by skip entry %d: %s\n", e.Seq, e.SkipSeq, e.Reason)
			}
		}
	}
	if !ok {
		return exitFailed
	}
	return exitOK
}

// replayProgress shows a replay's progress: entries imported and projected,
// and how much of the file is read.
func replayProgress(pr *progress) func(replay.Progress) {
	return func(p replay.Progress) {
		frac := 0.0
		if p.FileBytes > 0 {
			frac = float64(p.BytesRead) / float64(p.FileBytes)
		}
		pr.update(p.Imported, 0, fmt.Sprintf("entries imported and verified, %d projected", p.Projected), frac)
	}
}

// exportFromSeq reads the from_seq of an export file's header line.
func exportFromSeq(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errBadArg, err)
	}
	defer f.Close()
	line, err := bufio.NewReaderSize(f, 4096).ReadSlice('\n')
	switch {
	case len(line) > 0:
	case errors.Is(err, io.EOF):
		return 0, fmt.Errorf("%w: %s: empty file", stream.ErrBadExport, path)
	default:
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	var h stream.ExportHeader
	if json.Unmarshal(line, &h) != nil || h.Format != stream.ExportFormat {
		return 0, fmt.Errorf("%w: %s: line 1 is not a %s header", stream.ErrBadExport, path, stream.ExportFormat)
	}
	return h.FromSeq, nil
}

// countingFile tells each with the bytes read from a file so far.
type countingFile struct {
	f    *os.File
	n    int64
	each func(n int64)
}

func (c *countingFile) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	c.n += int64(n)
	c.each(c.n)
	return n, err
}

// lineCounter counts the lines read through it.
type lineCounter struct {
	r     io.Reader
	lines uint64
	each  func(lines uint64)
}

func (l *lineCounter) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if c := uint64(bytes.Count(p[:n], []byte{'\n'})); c > 0 {
		l.lines += c
		l.each(l.lines)
	}
	return n, err
}

// livePrefix is verify's `live` verdict for an export whose chain agrees with
// the live ledger's through the file's last sequence while the live ledger
// goes on past it (docs/cli.md, "cgledger verify").
const livePrefix = "prefix of the live ledger"

// lastSeq asks the server's /readyz for the ledger stream's last sequence
// (0 when it does not say).
func (c *clientFlags) lastSeq(ctx context.Context) uint64 {
	api, err := c.api()
	if err != nil {
		return 0
	}
	r, err := api.Ready(ctx)
	if err != nil {
		return 0
	}
	return r.LastSeq
}

// isNotServed reports an HTTP answer saying the route's role does not run in
// that serve process (violation not_served).
func isNotServed(err error) bool {
	var ae *apiError
	if !errors.As(err, &ae) {
		return false
	}
	for _, v := range ae.Err.Violations {
		if v.Code == protocol.VNotServed {
			return true
		}
	}
	return false
}

// isAuthRefusal reports an HTTP answer of 401 or 403: the credential, not
// the request's subject, was refused.
func isAuthRefusal(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden)
}
