package mcpbridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/protocol"
)

// Registrar registers tool definitions in the ledger: *ledger.Ledger, or a
// client.Client on an admin credential.
type Registrar interface {
	RegisterTool(ctx context.Context, d *protocol.ToolDefinition) (protocol.RegisterResult, error)
}

// Deps are what a bridge runs on.
type Deps struct {
	// Registrar registers the MCP tools.
	Registrar Registrar
	// Ledger returns the executor.Ledger and connection the executor of
	// the server with this target runs on: the in-process ledger in serve,
	// a client.Client made WithActor(target) on a tool credential bound to
	// target elsewhere.
	Ledger func(target string) (executor.Ledger, *nats.Conn, error)
	// Executor is the base configuration of every server's executor; its
	// Bindings are set per server, and its Registerer should be nil when
	// another executor of the process registers the same metrics.
	Executor executor.Config
	// Logger receives operational logs (never arguments, results or the
	// auth header's value). Nil discards them.
	Logger *slog.Logger
	// LookupEnv reads the auth header's variable. Nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// FailUnreachable makes Start fail (ErrServerUnreachable) when a
	// server cannot be reached or listed, as the standalone bridge does.
	// Without it such a server is retried with backoff, as one that died,
	// while the others serve: serve's mcp role must not stop the rest of
	// serve for one server.
	FailUnreachable bool
}

// ErrServerUnreachable is Start's error (under FailUnreachable) for a
// server that could not be started, connected, initialized or listed.
var ErrServerUnreachable = errors.New("MCP server unreachable")

// Bridge serves the tools of the configured MCP servers.
type Bridge struct {
	cfg     *Config
	deps    Deps
	log     *slog.Logger
	servers []*server

	stopOnce sync.Once
	// stopping keeps executors from starting once Stop began.
	stopping atomic.Bool
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// New checks cfg and returns a bridge; Start runs it.
func New(cfg *Config, deps Deps) (*Bridge, error) {
	if err := validate(cfg, deps); err != nil {
		return nil, err
	}
	if deps.Registrar == nil || deps.Ledger == nil {
		return nil, errors.New("mcpbridge: Deps.Registrar and Deps.Ledger are required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.LookupEnv == nil {
		deps.LookupEnv = os.LookupEnv
	}
	b := &Bridge{cfg: cfg, deps: deps, log: deps.Logger}
	for i := range cfg.Servers {
		b.servers = append(b.servers, newServer(b, &cfg.Servers[i]))
	}
	return b, nil
}

// validate lists the problems of cfg and of the executors' base
// configuration (deps.Executor, fields named "executor.<Field>") in one
// error, so a bridge that cannot run is told everything at once.
func validate(cfg *Config, deps Deps) error {
	err := cfg.Validate()
	xerr := deps.Executor.Validate()
	if xerr == nil {
		return err
	}
	var vs []protocol.Violation
	if err != nil {
		e, ok := protocol.AsError(err)
		if !ok {
			return err
		}
		vs = append(vs, e.Violations...)
	}
	xe, ok := protocol.AsError(xerr)
	if !ok {
		return xerr
	}
	for _, v := range xe.Violations {
		v.Field = "executor." + v.Field
		vs = append(vs, v)
	}
	return &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid MCP bridge config", Violations: vs}
}

// Start connects to every server, registers its tools and starts serving
// them. A server that cannot be reached at start is retried with backoff
// (logged) as one that died, and its tools registered once it answers;
// meanwhile its calls fail fast with S-TOOL-UNAVAILABLE (tools registered
// by an earlier run included). Under Deps.FailUnreachable it fails Start
// instead. Start fails for what the ledger refuses or cannot do (the
// executor's consumer).
func (b *Bridge) Start(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	for _, s := range b.servers {
		if err := s.start(ctx, runCtx); err != nil {
			b.Stop(context.WithoutCancel(ctx))
			return fmt.Errorf("mcpbridge: server %s: %w", s.cfg.Name, err)
		}
	}
	return nil
}

// Stop drains the executors (calls in flight finish or are handed back),
// then closes the MCP sessions. Safe to call more than once.
func (b *Bridge) Stop(ctx context.Context) {
	b.stopOnce.Do(func() {
		b.stopping.Store(true)
		for _, s := range b.servers {
			s.stopExecutor(ctx)
		}
		if b.cancel != nil {
			b.cancel()
		}
		for _, s := range b.servers {
			s.closeSession()
		}
		b.wg.Wait()
	})
}

// Tools returns, per server name, the ledger tool names registered from it
// and in force now.
func (b *Bridge) Tools() map[string][]string {
	out := map[string][]string{}
	for _, s := range b.servers {
		out[s.cfg.Name] = s.toolNames()
	}
	return out
}
