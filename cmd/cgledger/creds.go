package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cgledger/cgledger/internal/auth"
)

func creds(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" || args[0] == "help" {
		fmt.Fprint(os.Stderr, "Usage:\n  cgledger creds issue --project P --role worker|tool|auditor|admin|approver [--agent A] [--target W] [--tool T] [--approver NAME] [--ttl D] [--out FILE]\n")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "issue" {
		return credsIssue(args[1:])
	}
	return failf(exitUsage, "creds: unknown subcommand %q (issue)", args[0])
}

func credsIssue(args []string) int {
	fs := newFlagSet("creds issue", "creds issue --project P --role worker|tool|auditor|admin|approver [--agent A] [--target W] [--tool T] [--approver NAME] [--label L] [--ttl D] [--out FILE] [--json]",
		`Issue a NATS credential (a standard .creds file: user JWT and nkey seed) scoped to one
project and role, signed with the ledger account's signing key in the data directory
(so run it where serve's data is). Any NATS client in any language connects with it;
the HTTP API takes its JWT as a bearer token. See docs/security.md for what each role
may do. The client must use the inbox prefix printed on standard error (its permissions
allow replies only there). Short-lived by default (--ttl 1h); --ttl 0 means no expiry.`)
	data := fs.String("data", envOr("CGLEDGER_DATA", "./data"), "serve's data directory, holding auth/ (env CGLEDGER_DATA)")
	var g auth.Grant
	role := fs.String("role", "", "worker, tool, auditor, admin or approver (required; ledger for a serve process on a shared cluster)")
	fs.StringVar(&g.Project, "project", "", "project id (required; \"*\" for an admin or auditor of every project)")
	fs.StringVar(&g.Agent, "agent", "", "worker: the only agent id it may act as")
	fs.StringVar(&g.Target, "target", "", "worker: the worker target whose wakeups it may receive (default: --agent)")
	fs.StringVar(&g.Tool, "tool", "", "tool: the only tool target it serves (needed to pull the tool's durable consumer), or a PMO built-in (delegate_async, launch_principal, ask_expert, fork_join, provision_agent) whose cmd.sys.pmo.internal commands it serves")
	fs.StringVar(&g.Approver, "approver", "", "approver: its approver name (required), the name a tool's approval.approvers lists and its decisions record")
	fs.StringVar(&g.Label, "label", "", "a name for the holder, recorded in the credential")
	ttl := fs.Duration("ttl", auth.DefaultTTL, "how long the credential works; 0 means no expiry")
	out := fs.String("out", "", "write the .creds file here (mode 0600) instead of standard output")
	asJSON := fs.Bool("json", false, "print JSON (creds, jwt, inbox_prefix, expires, public_key, grant)")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	g.Role = auth.Role(*role)
	if errs := g.Validate(); len(errs) > 0 {
		return failf(exitUsage, "creds issue: %s", strings.Join(errs, "; "))
	}
	if *ttl < 0 {
		return failf(exitUsage, "creds issue: --ttl must not be negative")
	}
	is, err := auth.LoadIssuer(filepath.Join(*data, "auth"))
	if err != nil {
		return failf(exitUsage, "creds issue: %v (start `cgledger serve` once to create the keys, or pass --data)", err)
	}
	c, err := is.Issue(g, *ttl, time.Now())
	if err != nil {
		return failf(exitFailed, "creds issue: %v", err)
	}
	expires := "never"
	if !c.Expires.IsZero() {
		expires = c.Expires.UTC().Format(time.RFC3339)
	}
	// --out writes the file whether or not --json also prints the record.
	if *out != "" {
		if err := auth.WriteSecret(*out, c.Creds); err != nil {
			return failf(exitUsage, "creds issue: %v", err)
		}
	}
	if *asJSON {
		printJSON(map[string]any{"creds": string(c.Creds), "jwt": c.JWT, "inbox_prefix": c.InboxPrefix, "expires": expires, "public_key": c.PublicKey, "grant": c.Grant})
		return exitOK
	}
	if *out == "" {
		_, _ = stdout.Write(c.Creds)
	}
	fmt.Fprintf(os.Stderr, "role %s, project %s, expires %s\ninbox prefix: %s\n", g.Role, g.Project, expires, c.InboxPrefix)
	return exitOK
}
