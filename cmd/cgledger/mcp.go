package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/mcpfront"
	"github.com/cgledger/cgledger/protocol"
)

// mcpUsage lists the mcp verbs.
const mcpUsage = "Usage:\n  cgledger mcp serve --project P --agent A [--channel C]   the ledger as an MCP server on stdin/stdout (docs/mcp.md)\n"

// mcpCmd runs the mcp verbs (docs/cli.md, docs/mcp.md).
func mcpCmd(args []string) int {
	if code, done := groupHelp(args, mcpUsage); done {
		return code
	}
	switch args[0] {
	case "serve":
		return mcpServe(args[1:])
	}
	return failf(exitUsage, "mcp: unknown subcommand %q (serve)", args[0])
}

// mcpBuiltins are the tools every project has without registering them:
// the executor's built-ins, which serve's executor role runs.
func mcpBuiltins() []*protocol.ToolDefinition {
	return []*protocol.ToolDefinition{executor.EchoDefinition, executor.SleepDefinition}
}

func mcpServe(args []string) int {
	fs := newFlagSet("mcp serve", "mcp serve --project P --agent A [--channel C] [--max-message-bytes N]",
		`Serve the ledger as an MCP server on standard input and output (newline-delimited JSON-RPC,
MCP's stdio transport), for an MCP client that starts it as a subprocess. tools/list lists the
project's tools; tools/call dispatches a call as agent A, in the session's turn, and answers with
its result card (docs/mcp.md). The connection is a worker's: pass a worker credential of project P
(--creds; bound to agent A or to none). Logs go to standard error.`)
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required)")
	agent := fs.String("agent", "", "agent id the calls are dispatched as (required)")
	channel := fs.String("channel", mcpfront.DefaultChannel, "channel id of the calls")
	maxBytes := fs.Int("max-message-bytes", mcpfront.DefaultMaxMessageBytes, "largest JSON-RPC message (one line) read; a longer one is refused")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	var missing []string
	if *project == "" {
		missing = append(missing, "--project")
	}
	if *agent == "" {
		missing = append(missing, "--agent")
	}
	if len(missing) > 0 {
		return failf(exitUsage, "mcp serve: missing %v", missing)
	}
	if *maxBytes < 1024 {
		return failf(exitUsage, "mcp serve: --max-message-bytes must be at least 1024, got %d", *maxBytes)
	}
	nc, err := cf.connect()
	if err != nil {
		return failf(exitFor(err), "mcp serve: %v", err)
	}
	defer nc.Close()
	cl := client.New(nc, client.WithActor(*agent))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	front, err := mcpfront.New(mcpfront.Config{Project: *project, Agent: *agent, Channel: *channel, Ledger: cl,
		Builtins: mcpBuiltins(), Logger: log, Version: version})
	if err != nil {
		return failf(exitUsage, "mcp serve: %v", err)
	}
	// Whether the credential reaches the project is known now, not at the
	// client's first call.
	pctx, cancel := cf.context(15 * time.Second)
	_, err = cl.ListTools(pctx, *project)
	err = cf.explain(pctx, err)
	cancel()
	if err != nil {
		return failf(exitFor(err), "mcp serve: list the tools of project %s: %v", *project, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("cgledger mcp serve: serving MCP on stdio", "project", *project, "agent", *agent, "channel", *channel)
	err = front.Server().Run(ctx, &mcpfront.StdioTransport{In: os.Stdin, Out: os.Stdout, MaxMessageBytes: *maxBytes})
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) && ctx.Err() == nil {
		return failf(exitFailed, "mcp serve: %v", err)
	}
	return exitOK
}

// mcpStreamPollAfter is mcp_stream_poll_after as a duration: zero when off
// (validated by check).
func (s Settings) mcpStreamPollAfter() time.Duration {
	if s.MCPStreamPollAfter == "" || s.MCPStreamPollAfter == "off" {
		return 0
	}
	d, _ := time.ParseDuration(s.MCPStreamPollAfter)
	return d
}
