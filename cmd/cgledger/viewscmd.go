package main

import (
	"fmt"
	"os"
	"time"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/protocol"
)

func viewsCmd(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" || args[0] == "help" {
		fmt.Fprint(os.Stderr, "Usage:\n  cgledger views snapshot [--json]   take a snapshot of the views now (a serve without views restores the newest)\n")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "snapshot" {
		return viewsSnapshot(args[1:])
	}
	return failf(exitUsage, "views: unknown subcommand %q (snapshot)", args[0])
}

func viewsSnapshot(args []string) int {
	fs := newFlagSet("views snapshot", "views snapshot [--actor NAME] [--timeout D] [--json]",
		`Ask a running serve (one that runs the projector) to take a snapshot of its views now, as its
views_snapshot_every schedule does, and print its manifest: name, checkpoint sequence, digest,
size. The snapshot goes where that serve keeps them (views_snapshot_dir, else the Object Store
bucket of the ledger's account), older ones are pruned to views_snapshot_keep, and a serve that
starts without views restores the newest that passes its checks (docs/views.md, "Snapshots").
Needs an admin credential of every project (the embedded admin credential is one).`)
	var cf clientFlags
	cf.register(fs)
	actor := fs.String("actor", envOr("USER", "operator"), "who asks (the actor token of the request; an identifier)")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long to wait for the snapshot (a serve gives one request up to 10m)")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	if !protocol.ValidIdentifier(*actor) {
		return failf(exitUsage, "views snapshot: --actor %q is not an identifier", *actor)
	}
	if *timeout <= 0 {
		return failf(exitUsage, "views snapshot: --timeout must be positive, got %s", *timeout)
	}
	nc, err := cf.connect()
	if err != nil {
		return failf(exitFor(err), "views snapshot: %v", err)
	}
	defer nc.Close()
	ctx, cancel := cf.context(*timeout)
	defer cancel()
	res, err := client.New(nc, client.WithActor(*actor)).ViewsSnapshot(ctx)
	if err != nil {
		err = cf.explain(ctx, err)
		return failf(exitFor(err), "views snapshot: %v", err)
	}
	if cf.asJSON {
		printJSON(res)
		return exitOK
	}
	fmt.Fprintf(stdout, "snapshot %s: views at seq %d, digest %s, %d bytes in %d files, kept in %s (%d ms)\n",
		res.Name, res.AppliedSeq, res.Digest, res.Size, res.Files, res.Target, res.DurationMS)
	for _, name := range res.Pruned {
		fmt.Fprintf(stdout, "pruned %s\n", name)
	}
	return exitOK
}
