package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/mcpbridge"
	"github.com/cgledger/cgledger/mcpfront"
	"github.com/cgledger/cgledger/protocol"
)

// mcpUsage lists the mcp verbs.
const mcpUsage = "Usage:\n" +
	"  cgledger mcp bridge --config FILE [--project P] [--creds TOOL.creds] [--admin-creds ADMIN.creds]\n" +
	"                     serve the tools of MCP servers as ledger tools (docs/mcp.md)\n" +
	"  cgledger mcp serve --project P --agent A [--channel C]\n" +
	"                     the ledger as an MCP server on stdin/stdout (docs/mcp.md)\n"

// mcpCmd runs the mcp verbs (docs/cli.md, docs/mcp.md).
func mcpCmd(args []string) int {
	if code, done := groupHelp(args, mcpUsage); done {
		return code
	}
	switch args[0] {
	case "bridge":
		return mcpBridge(args[1:])
	case "serve":
		return mcpServe(args[1:])
	}
	return failf(exitUsage, "mcp: unknown subcommand %q (bridge, serve)", args[0])
}

func mcpBridge(args []string) int {
	fs := newFlagSet("mcp bridge", "mcp bridge --config FILE [--project P] [connection flags] [--admin-creds FILE]",
		`Connect to the MCP servers of the bridge configuration (docs/mcp.md), register their tools in the
project and serve their calls until interrupted (SIGINT, SIGTERM: calls in flight finish first).
--creds is the tool credential that serves them (cgledger creds issue --role tool --tool <target>,
one server per credential); --admin-creds, when given, the admin credential that registers the
tools (without it they are registered on the --creds connection, which works with --no-auth or an
admin credential of the project's ledger).`)
	var cf clientFlags
	cf.register(fs)
	cfgPath := fs.String("config", "", "MCP bridge configuration file, YAML or JSON (required)")
	project := fs.String("project", "", "project id (overrides the configuration's project)")
	adminCreds := fs.String("admin-creds", "", "admin credential that registers the tools")
	sourceID := fs.String("source-id", "cgledger.mcpbridge", "author_id of the result cards")
	cardKeyEnv := fs.String("card-key-env", "", "environment variable holding the secret that keys result card ids (the same for every bridge of the deployment; docs/executor.md)")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	if *cfgPath == "" {
		return failf(exitUsage, "mcp bridge: --config is required")
	}
	cfg, err := mcpbridge.ReadConfig(*cfgPath)
	if err == nil {
		if *project != "" {
			cfg.Project = *project
		}
		err = cfg.Validate()
	}
	if err != nil {
		return failf(exitUsage, "mcp bridge: %v", describe(err))
	}
	var cardKey []byte
	if *cardKeyEnv != "" {
		v, ok := os.LookupEnv(*cardKeyEnv)
		if !ok || v == "" {
			return failf(exitUsage, "mcp bridge: --card-key-env %s is unset or empty", *cardKeyEnv)
		}
		cardKey = []byte(v)
	}
	nc, err := cf.connect()
	if err != nil {
		return failf(exitFor(err), "mcp bridge: %v", err)
	}
	defer nc.Close()
	var reg mcpbridge.Registrar = client.New(nc)
	if *adminCreds != "" {
		acf := cf
		acf.creds = *adminCreds
		anc, err := acf.connect()
		if err != nil {
			return failf(exitFor(err), "mcp bridge: admin connection: %v", err)
		}
		defer anc.Close()
		reg = client.New(anc)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	b, err := mcpbridge.New(cfg, mcpbridge.Deps{
		Registrar: reg,
		Ledger: func(target string) (executor.Ledger, *nats.Conn, error) {
			return client.New(nc, client.WithActor(target)), nc, nil
		},
		Executor: executor.Config{SourceID: *sourceID, Logger: log, CardIDKey: cardKey},
		Logger:   log,
		// A process of its own for its servers: a server that cannot be
		// reached at start is said at once (exit 3), for its supervisor.
		FailUnreachable: true,
	})
	if err != nil {
		return failf(exitUsage, "mcp bridge: %v", describe(err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = b.Start(sctx)
	cancel()
	if err != nil {
		code := exitFor(err)
		if errors.Is(err, mcpbridge.ErrServerUnreachable) {
			code = exitUnreachable
		}
		return failf(code, "mcp bridge: %v", err)
	}
	for name, tools := range b.Tools() {
		log.Info("serving MCP server", "server", name, "tools", len(tools))
	}
	<-ctx.Done()
	b.Stop(context.Background())
	return exitOK
}

// describe is err with every violation of a refusal listed.
func describe(err error) string {
	if e, ok := protocol.AsError(err); ok && len(e.Violations) > 0 {
		s := e.Message + ":"
		for _, v := range e.Violations {
			s += fmt.Sprintf("\n  %s: %s (%s)", v.Field, v.Message, v.Code)
		}
		return s
	}
	return err.Error()
}

// startMCPBridge runs the bridge of the mcp role in serve's process, on
// the ledger itself. stop drains it (once).
func startMCPBridge(ctx context.Context, s Settings, l *ledger.Ledger, nc *nats.Conn, log *slog.Logger, cardKey []byte) (stop func(), err error) {
	cfg, err := mcpbridge.LoadConfig(s.MCPBridge)
	if err != nil {
		return nil, fmt.Errorf("mcp role: %s", describe(err))
	}
	ackWait, _ := time.ParseDuration(s.AckWait) // validated; empty is the default
	b, err := mcpbridge.New(cfg, mcpbridge.Deps{
		Registrar: l,
		Ledger:    func(string) (executor.Ledger, *nats.Conn, error) { return localLedger{l}, nc, nil },
		// No Registerer: serve's own executor registers the executor
		// metrics, and a second set would collide.
		Executor: executor.Config{SourceID: s.SourceID, Logger: log, CardIDKey: cardKey, AckWait: ackWait},
		Logger:   log,
	})
	if err != nil {
		return nil, fmt.Errorf("mcp role: %s", describe(err))
	}
	if err := b.Start(ctx); err != nil {
		return nil, fmt.Errorf("mcp role: %w", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			b.Stop(context.Background())
			log.Info("MCP bridge drained")
		})
	}, nil
}

// localLedger is the ledger for an executor in its own process: the
// consumer's JetStream API prefix is the one of client accounts, which
// the ledger's own connection does not have (it reaches $JS.API directly).
type localLedger struct{ *ledger.Ledger }

// EnsureToolConsumer implements executor.Ledger, without the API prefix.
func (l localLedger) EnsureToolConsumer(ctx context.Context, project, tool string) (protocol.ToolConsumer, error) {
	tc, err := l.Ledger.EnsureToolConsumer(ctx, project, tool)
	tc.APIPrefix = ""
	return tc, err
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
	if why := mcpServeGrantProblem(cf.creds, *project, *agent); why != "" {
		return failf(exitFailed, "mcp serve: the credential %s (from %s) cannot dispatch as agent %s in project %s: %s", cf.creds, cf.from("creds"), *agent, *project, why)
	}
	nc, err := cf.connect()
	if err != nil {
		return failf(exitFor(err), "mcp serve: %v", err)
	}
	defer nc.Close()
	cl := client.New(nc, client.WithActor(*agent))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	front, err := mcpfront.New(mcpfront.Config{Project: *project, Agent: *agent, Channel: *channel, Ledger: newRefusingLedger(nc, cl),
		Subscribe: natsSubscribe(nc), Builtins: mcpBuiltins(), Logger: log, Version: version})
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
	// From now on a refusal is the front door's to report, not the start's:
	// a credential that may not hear the agent's wakeups (bound to another
	// worker target) leaves the front door polling, and says so here.
	nc.SetErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		subject := ""
		if sub != nil {
			subject = sub.Subject
		}
		log.Warn("mcp serve: NATS error; calls are answered by polling where wakeups cannot be heard", "subject", subject, "err", err)
	})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("cgledger mcp serve: serving MCP on stdio", "project", *project, "agent", *agent, "channel", *channel)
	err = front.Server().Run(ctx, &mcpfront.StdioTransport{In: os.Stdin, Out: os.Stdout, MaxMessageBytes: *maxBytes})
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) && ctx.Err() == nil {
		return failf(exitFailed, "mcp serve: %v", err)
	}
	return exitOK
}

// natsSubscribe is the front door's way to hear wakeups: a plain core NATS
// subscription on nc (no queue group, so the agent's own worker still gets
// every wakeup).
func natsSubscribe(nc *nats.Conn) mcpfront.Subscribe {
	return func(subject string, fn func([]byte)) (func(), error) {
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) { fn(m.Data) })
		if err != nil {
			return nil, fmt.Errorf("subscribe to %s: %w", subject, err)
		}
		return func() { _ = sub.Unsubscribe() }, nil
	}
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
