// Package natstest is the shared test harness: a real in-process nats-server
// with JetStream on file storage in a test's temporary directory, on a random
// loopback port, shut down by t.Cleanup. It can stop and restart a server on
// the same store directory and port so tests can check recovery. Cluster is
// the same for a JetStream cluster of several servers in the process.
package natstest

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/internal/natsserver"
)

// Server is one embedded JetStream server owned by a test.
type Server struct {
	tb     testing.TB
	cfg    natsserver.Config
	keys   *auth.Keys
	ledger *auth.Credential

	mu    sync.Mutex
	srv   *server.Server
	conns []*nats.Conn
}

// Option adjusts the server configuration before the first start.
type Option func(*natsserver.Config)

// WithSyncAlways makes the server fsync every write before acknowledging it.
func WithSyncAlways() Option { return func(c *natsserver.Config) { c.SyncAlways = true } }

// WithStoreDir puts the JetStream store in dir instead of a new temp dir.
func WithStoreDir(dir string) Option { return func(c *natsserver.Config) { c.StoreDir = dir } }

// WithAuth runs the server in operator mode with fresh keys, as serve does by
// default: Connect then connects as the ledger, and ConnectAs as a client.
func WithAuth() Option {
	return func(c *natsserver.Config) { c.Trust = &auth.ServerTrust{} }
}

// Start starts a server for tb and registers its shutdown with tb.Cleanup.
// It fails the test (it does not panic) when the server cannot start.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	cfg := natsserver.Config{StoreDir: tb.TempDir(), ReadyTimeout: 10 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	s := &Server{tb: tb, cfg: cfg}
	if cfg.Trust != nil {
		keys, err := auth.LoadOrCreateKeys(tb.TempDir())
		if err != nil {
			tb.Fatalf("natstest: keys: %v", err)
			return nil
		}
		trust, err := keys.Trust()
		if err != nil {
			tb.Fatalf("natstest: trust: %v", err)
			return nil
		}
		s.keys, s.cfg.Trust, cfg.Trust = keys, trust, trust
		s.ledger = s.Issue(tb, auth.Grant{Role: auth.RoleLedger, Label: "natstest"}, 0)
	}
	srv, err := natsserver.Start(cfg)
	if err != nil {
		tb.Fatalf("natstest: start server: %v", err)
		return nil
	}
	s.srv = srv
	// Pin the port so clients reconnect to the same URL after Restart.
	s.cfg.Port = natsserver.Port(srv)
	tb.Cleanup(s.Shutdown)
	return s
}

// URL is the client URL of the server.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "nats://" + s.srv.Addr().String()
}

// StoreDir is the JetStream store directory, kept across restarts.
func (s *Server) StoreDir() string { return s.cfg.StoreDir }

// Keys are the server's keys under WithAuth (nil otherwise).
func (s *Server) Keys() *auth.Keys { return s.keys }

// Issue signs a credential for g (valid for ttl; zero means no expiry). It
// needs WithAuth.
func (s *Server) Issue(tb testing.TB, g auth.Grant, ttl time.Duration) *auth.Credential {
	tb.Helper()
	if s.keys == nil {
		tb.Fatalf("natstest: Issue needs WithAuth")
		return nil
	}
	is, err := s.keys.Issuer()
	if err != nil {
		tb.Fatalf("natstest: issuer: %v", err)
		return nil
	}
	c, err := is.Issue(g, ttl, time.Now())
	if err != nil {
		tb.Fatalf("natstest: issue: %v", err)
		return nil
	}
	return c
}

// Connect opens a client connection that reconnects forever (so it survives
// Restart) and is closed by tb.Cleanup. Under WithAuth it connects as the
// ledger itself.
func (s *Server) Connect(tb testing.TB) *nats.Conn {
	tb.Helper()
	return s.connect(tb, s.ledger)
}

// ConnectAs connects with a credential, using the inbox prefix its
// permissions allow.
func (s *Server) ConnectAs(tb testing.TB, c *auth.Credential) *nats.Conn {
	tb.Helper()
	return s.connect(tb, c)
}

// Dial connects with the given options only (no credential, or the caller's
// own), without failing the test: for tests that expect a refusal.
func (s *Server) Dial(opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(s.URL(), opts...)
	if err == nil {
		s.tb.Cleanup(nc.Close)
	}
	return nc, err
}

func (s *Server) connect(tb testing.TB, c *auth.Credential) *nats.Conn {
	tb.Helper()
	opts := []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond),
		nats.RetryOnFailedConnect(false),
	}
	if c != nil {
		opts = append(opts, nats.UserJWTAndSeed(c.JWT, c.Seed))
		if c.Grant.Role != auth.RoleLedger {
			opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
		}
	}
	nc, err := nats.Connect(s.URL(), opts...)
	if err != nil {
		tb.Fatalf("natstest: connect %s: %v", s.URL(), err)
		return nil
	}
	tb.Cleanup(nc.Close)
	s.mu.Lock()
	s.conns = append(s.conns, nc)
	s.mu.Unlock()
	return nc
}

// Shutdown stops the server and waits until it has stopped. It is safe to
// call more than once.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Shutdown()
	srv.WaitForShutdown()
}

// Restart stops the server and starts a new one on the same store directory
// and port, then waits until every open connection made by Connect has
// reconnected (a connection can look connected for a moment after its server
// died, and a request sent then is lost). It fails the test when the new
// server cannot start or a connection does not come back.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	before := make(map[*nats.Conn]uint64, len(s.conns))
	for _, nc := range s.conns {
		before[nc] = nc.Stats().Reconnects
	}
	s.mu.Unlock()
	s.Shutdown()
	var (
		srv *server.Server
		err error
	)
	// The old listener's port can take a moment to be released by the kernel;
	// retry on a deadline rather than sleeping a fixed time.
	deadline := time.Now().Add(10 * time.Second)
	for {
		srv, err = natsserver.Start(s.cfg)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		tb.Fatalf("natstest: restart server on %s: %v", s.cfg.StoreDir, err)
		return
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	for nc, n := range before {
		for !nc.IsClosed() && (nc.Stats().Reconnects == n || !nc.IsConnected()) {
			if time.Now().After(deadline.Add(10 * time.Second)) {
				tb.Fatalf("natstest: connection did not reconnect after restart (status %v)", nc.Status())
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// NATS returns the running server, for tests that need server internals.
func (s *Server) NATS() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}
