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
  cgledger serve [flags]   run the embedded nats-server, the ledger API and /metrics
  cgledger version         print the build version and commit

Run "cgledger serve --help" for the serve flags.
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
	case "version", "--version":
		fmt.Printf("cgledger %s %s\n", version, buildCommit())
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
