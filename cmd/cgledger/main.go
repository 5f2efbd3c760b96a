// Command cgledger runs the callback ledger. `cgledger serve` starts an
// embedded JetStream nats-server, the ledger and its NATS request/reply API,
// and an HTTP server with /healthz and /metrics.
package main

import (
	"fmt"
	"os"
	"runtime/debug"
)

// version and commit are set at build time with -ldflags "-X main.version=...".
var (
	version = "dev"
	commit  = ""
)

const usage = `cgledger: an event-sourced callback ledger for AI-agent tool calls on NATS JetStream.

Usage:
  cgledger serve [flags]                       run the ledger (embedded nats-server by default)
  cgledger check-config [flags]                validate the serve configuration and print it
  cgledger call --project P --agent A --tool T --args JSON
                                               dispatch a tool call and wait for its result
  cgledger tools register FILE.yaml --project P
  cgledger tools list --project P              register and list tools
  cgledger approvals list|show|approve|deny --project P [TURN CALL]
                                               list, show and decide calls held for approval
  cgledger calls cancel|resolve --project P --turn T --call C --reason R [--effect applied|not_applied]
                                               operator actions: cancel any call, resolve an outcome_unknown one
  cgledger conformance --project P --tool T [--fixture FILE] [--json]
                                               check a running tool service against the protocol's cases
  cgledger audit projects | calls --project P [filters]
  cgledger audit turn|call|agent|card ID --project P [--as-of-seq N | --as-of TIME]
                                               read history from the views
  cgledger export --out FILE [--from-seq N]    export the ledger (versioned JSON Lines)
  cgledger replay FILE [--expect DIGEST]       replay an export in a fresh embedded server
  cgledger verify [FILE]                       check the hash chain (of a file, or the live ledger)
  cgledger creds issue --project P --role worker|tool|auditor|admin|approver [--agent A] [--tool T] [--approver NAME] [--ttl D]
                                               issue a scoped, short-lived NATS credential
  cgledger projector skip --seq N --reason TEXT
                                               record an audited skip of an entry the projector cannot apply
  cgledger views snapshot                      take a snapshot of the views now (restored by a serve without views)
  cgledger views snapshots                     list the snapshots of the views, newest first
  cgledger mcp serve --project P --agent A     the ledger as an MCP server on stdio (also /mcp/P/A on serve's HTTP)
  cgledger bench [--inflight 1,16,256] [--sync-always]
                                               measure a tool call against raw JetStream, side by side
  cgledger mcp bridge --config FILE [--project P]
                                               serve the tools of MCP servers as ledger tools
  cgledger version                             print the build version and commit

Every command takes --help. Client verbs (call, tools, approvals, calls, conformance, audit, export, verify, projector, views, mcp)
share the connection flags --nats-url, --server, --creds, --nats-user, --nats-password,
--nats-token, --tls-ca, --tls-cert, --tls-key and their CGLEDGER_* variables. Exit codes:
0 ok, 1 the operation said no (call not success, verification failed, request refused),
2 usage or configuration error (including a named file that cannot be read or written),
3 server unreachable.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:])
	case "check-config":
		return checkConfig(args[1:])
	case "call":
		return call(args[1:])
	case "tools":
		return tools(args[1:])
	case "approvals":
		return approvals(args[1:])
	case "calls":
		return calls(args[1:])
	case "conformance":
		return conformanceCmd(args[1:])
	case "audit":
		return audit(args[1:])
	case "bench":
		return bench(args[1:])
	case "mcp":
		return mcpCmd(args[1:])
	case "projector":
		return projectorCmd(args[1:])
	case "views":
		return viewsCmd(args[1:])
	case "creds":
		return creds(args[1:])
	case "export":
		return export(args[1:])
	case "replay":
		return replayCmd(args[1:])
	case "verify":
		return verify(args[1:])
	case "version", "--version":
		fs := newFlagSet("version", "version", "Print the build version and commit.")
		if _, code, ok := parseOrExit(fs, args[1:], 0); !ok {
			return code
		}
		fmt.Fprintf(stdout, "cgledger %s %s\n", version, buildCommit())
		return 0
	case "help", "-h", "--help":
		fmt.Print(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "cgledger: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

func buildCommit() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
