package main

import (
	"errors"
	"fmt"

	"github.com/cgledger/cgledger/stream"
)

// verify's verdicts, apart from the reading of files and the requests to a
// server that gather what they judge: each takes what was read or answered
// and returns the report's body (and whether it passes), so that every
// verdict is tested without a file or a server.

// unreadableVerdict is the report on a file that cannot be read as an
// export: a verdict too, with the same report as a broken chain. The reason
// is the error that says what is wrong with the file (it wraps
// ErrBadExport), without the callers' prefixes.
func unreadableVerdict(file string, err error) map[string]any {
	for u := errors.Unwrap(err); u != nil && u != stream.ErrBadExport; u = errors.Unwrap(u) {
		err = u
	}
	return map[string]any{"file": file, "ok": false, "reason": err.Error()}
}

// fileVerdict is the report on an export file's own chain (rep) and its
// view digest.
func fileVerdict(file string, rep stream.VerifyReport, digest string) map[string]any {
	body := map[string]any{"file": file, "ok": rep.OK, "count": rep.Count, "last_seq": rep.LastSeq, "chain_head": rep.Head}
	noted(body, rep)
	if !rep.OK {
		body["first_bad_seq"], body["reason"] = rep.FirstBadSeq, rep.Reason
	} else {
		body["digest"] = digest
	}
	return body
}

// linkRefusal is why the live server gave no chain link at the file's last
// sequence.
type linkRefusal int

const (
	linkGiven       linkRefusal = iota // it gave one
	linkUnreachable                    // it could not be reached
	linkNotServed                      // it runs without the projector role
	linkAuthRefused                    // it refused the credential
	linkMissing                        // it answered, with no link there
)

// linkAnswer is what the live server answered verify about an export whose
// own chain holds.
type linkAnswer struct {
	server string
	// link is its chain link at the file's last sequence, when refusal is
	// linkGiven; err says why not otherwise.
	link    string
	err     error
	refusal linkRefusal
	// lastSeq is the live stream's last sequence (0 when it did not say),
	// asked only when the links agree.
	lastSeq uint64
}

// refusalOf classifies an error of the request for a chain link.
func refusalOf(err error) linkRefusal {
	switch {
	case err == nil:
		return linkGiven
	case errors.Is(err, errUnreachable):
		return linkUnreachable
	case isNotServed(err):
		return linkNotServed
	case isAuthRefusal(err):
		return linkAuthRefused
	}
	return linkMissing
}

// agrees reports whether the live link at the file's last sequence is the
// file's chain head: only then is the live end worth asking for.
func (a linkAnswer) agrees(rep stream.VerifyReport) bool {
	return a.refusal == linkGiven && a.link == rep.Head
}

// verdictExit is verify ending without a verdict on the file: its exit code
// and message.
type verdictExit struct {
	code int
	msg  string
}

// liveVerdict adds to body (fileVerdict's, for a file whose chain holds)
// the comparison with the live ledger, and returns whether the file passes.
// against is --against (empty when the server is only --server's default,
// which may be unreachable without failing the verification). A non-nil
// verdictExit means there is no verdict: verify exits with it.
func liveVerdict(body map[string]any, rep stream.VerifyReport, a linkAnswer, against string) (bool, *verdictExit) {
	switch a.refusal {
	case linkGiven:
		body["against"], body["live_link"] = a.server, a.link
		if a.link == rep.Head {
			// The file agrees with the live ledger through its last
			// sequence; whether it is all of it is the live end's to say.
			// A faithful prefix is not tampering (exit 0), but it is not
			// the ledger either, and an auditor must see which it is.
			switch end := a.lastSeq; {
			case end > rep.LastSeq:
				body["live"], body["live_last_seq"] = livePrefix, end
			case end == 0:
				body["live"] = fmt.Sprintf("matches at seq %d; the live ledger's last seq is unknown (its /readyz did not say)", rep.LastSeq)
			default:
				body["live"] = "matches"
			}
			return true, nil
		}
		body["live"] = "DIFFERS"
		body["first_bad_seq"] = rep.LastSeq
		body["reason"] = fmt.Sprintf("the file's chain head at seq %d is %s, the live ledger's link there is %s: an entry at or before seq %d was changed after export (and the links recomputed), or the file comes from another ledger", rep.LastSeq, rep.Head, a.link, rep.LastSeq)
		return false, nil
	case linkUnreachable:
		if against != "" {
			return false, &verdictExit{exitFor(a.err), fmt.Sprintf("verify: --against %s: %v", against, a.err)}
		}
		body["live"] = "not compared (" + a.err.Error() + "; use --against URL)"
		return true, nil
	case linkNotServed:
		// Not a verdict either: this process does not run the views.
		return false, &verdictExit{exitUnreachable, fmt.Sprintf("verify: %s does not serve the chain links (it runs without the projector role, serve --roles); compare against a process that does: %v", a.server, a.err)}
	case linkAuthRefused:
		// Not a verdict on the file: the server would not show its link
		// to this credential.
		return false, &verdictExit{exitFor(a.err), fmt.Sprintf("verify: %s refused to show its chain link at seq %d: %v", a.server, rep.LastSeq, a.err)}
	}
	// The server answered, with no link there: the file claims entries the
	// live ledger does not have (or it refused us).
	body["against"] = a.server
	body["live"] = "DIFFERS"
	body["first_bad_seq"] = rep.LastSeq
	body["reason"] = fmt.Sprintf("the live ledger has no chain link at the file's last seq %d (%v): the file holds entries the ledger does not", rep.LastSeq, a.err)
	return false, nil
}

// serverVerdict is the report on a running server's own verification (rep,
// GET /v1/verify) and its views' digest (GET /v1/digest).
func serverVerdict(server string, rep stream.VerifyReport, appliedSeq uint64, digest, viewsHead string) map[string]any {
	body := map[string]any{"server": server, "ok": rep.OK, "count": rep.Count, "last_seq": rep.LastSeq, "chain_head": rep.Head,
		"views_applied_seq": appliedSeq, "views_chain_head": viewsHead, "digest": digest}
	noted(body, rep)
	if !rep.OK {
		body["first_bad_seq"], body["reason"] = rep.FirstBadSeq, rep.Reason
	}
	return body
}
