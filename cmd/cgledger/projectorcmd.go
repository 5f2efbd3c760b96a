package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/protocol"
)

func projectorCmd(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" || args[0] == "help" {
		fmt.Fprint(os.Stderr, "Usage:\n  cgledger projector skip --seq N --reason TEXT   record an audited skip of an entry the projector cannot apply\n")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "skip" {
		return projectorSkip(args[1:])
	}
	return failf(exitUsage, "projector: unknown subcommand %q (skip)", args[0])
}

func projectorSkip(args []string) int {
	fs := newFlagSet("projector skip", "projector skip --seq N --reason TEXT [--actor NAME] [--json]",
		`Record, as a ledger entry, the operator's decision that the projector skips the entry at
sequence N: the one it stopped on because it cannot apply it (a corrupt entry; /readyz names
it). A running server picks the skip up within seconds and goes on; the skipped entry stays in
the ledger and is shown as skipped in the views, and the skip entry (with its reason and
actor) is in the audit history. Needs an admin credential of every project (the embedded
admin credential is one). See docs/views.md, "Operator recovery".`)
	var cf clientFlags
	cf.register(fs)
	seq := fs.Uint64("seq", 0, "the sequence to skip (required)")
	reason := fs.String("reason", "", "why (required; recorded in the ledger)")
	actor := fs.String("actor", envOr("USER", "operator"), "who decides (recorded as CG-Actor; an identifier)")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	var missing []string
	if *seq == 0 {
		missing = append(missing, "--seq")
	}
	if strings.TrimSpace(*reason) == "" {
		missing = append(missing, "--reason")
	}
	if len(missing) > 0 {
		return failf(exitUsage, "projector skip: missing %v", missing)
	}
	if !protocol.ValidIdentifier(*actor) {
		return failf(exitUsage, "projector skip: --actor %q is not an identifier", *actor)
	}
	nc, err := cf.connect()
	if err != nil {
		return failf(exitFor(err), "projector skip: %v", err)
	}
	defer nc.Close()
	ctx, cancel := cf.context(time.Minute)
	defer cancel()
	res, err := client.New(nc, client.WithActor(*actor)).Skip(ctx, *seq, *reason)
	if err != nil {
		err = cf.explain(ctx, err)
		return failf(exitFor(err), "projector skip: %v", err)
	}
	if cf.asJSON {
		printJSON(res)
		return exitOK
	}
	what := "recorded"
	if res.Duplicate {
		what = "already recorded"
	}
	fmt.Fprintf(stdout, "skip of seq %d %s as entry %d (%s): %s\n", res.Seq, what, res.SkipSeq, res.Subject, res.Reason)
	return exitOK
}
