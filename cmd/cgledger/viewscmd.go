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
		fmt.Fprint(os.Stderr, "Usage:\n  cgledger views snapshot [--actor NAME] [--timeout 10m] [--json]  take a snapshot of the views now (a serve without views restores the newest)\n  cgledger views snapshots [--json]  list the snapshots, newest first\n")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	switch args[0] {
	case "snapshot":
		return viewsSnapshot(args[1:])
	case "snapshots":
		return viewsSnapshots(args[1:])
	}
	return failf(exitUsage, "views: unknown subcommand %q (snapshot, snapshots)", args[0])
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

func viewsSnapshots(args []string) int {
	fs := newFlagSet("views snapshots", "views snapshots [--actor NAME] [--json]",
		`List the snapshots of the views where a running serve (one that runs the projector) keeps
them, newest first: name, checkpoint sequence, size, when and where taken. The one a serve
without views restores is the newest that passes its checks (docs/views.md, "Snapshots").
Needs an admin credential of every project (the embedded admin credential is one).`)
	var cf clientFlags
	cf.register(fs)
	actor := fs.String("actor", envOr("USER", "operator"), "who asks (the actor token of the request; an identifier)")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	if !protocol.ValidIdentifier(*actor) {
		return failf(exitUsage, "views snapshots: --actor %q is not an identifier", *actor)
	}
	nc, err := cf.connect()
	if err != nil {
		return failf(exitFor(err), "views snapshots: %v", err)
	}
	defer nc.Close()
	ctx, cancel := cf.context(time.Minute)
	defer cancel()
	res, err := client.New(nc, client.WithActor(*actor)).ViewsSnapshotList(ctx)
	if err != nil {
		err = cf.explain(ctx, err)
		return failf(exitFor(err), "views snapshots: %v", err)
	}
	if cf.asJSON {
		printJSON(res)
		return exitOK
	}
	fmt.Fprintf(stdout, "%d snapshots in %s\n", len(res.Snapshots), res.Target)
	for _, m := range res.Snapshots {
		fmt.Fprintf(stdout, "%s  seq %d  %d bytes  %s  %s\n", m.Name, m.AppliedSeq, m.Size, m.Created.Format(time.RFC3339), m.Host)
	}
	return exitOK
}
