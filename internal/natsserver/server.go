// Package natsserver starts an in-process nats-server with JetStream on file
// storage. It is the one place that knows how cgledger embeds NATS, so the
// serve command and the test harness embed it the same way.
package natsserver

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/cgledger/cgledger/internal/auth"
)

// Config says where and how the embedded server runs. The zero value is a
// usable server on a random loopback port that stores nothing durable
// anywhere sensible, so callers always set StoreDir.
type Config struct {
	// StoreDir holds JetStream's file store. Required.
	StoreDir string
	// Host to listen on. Empty means 127.0.0.1.
	Host string
	// Port to listen on. Zero means a random free port.
	Port int
	// ServerName names the server in JetStream metadata. Empty means
	// "cgledger-embedded"; it must stay the same across restarts on one store.
	ServerName string
	// SyncInterval is how often JetStream fsyncs its file store. Zero keeps
	// nats-server's default (2 minutes): an acknowledged write can be lost if
	// the host (not just the process) crashes inside that interval.
	SyncInterval time.Duration
	// SyncAlways fsyncs every write before it is acknowledged. It closes the
	// host-crash window at a large throughput cost (see docs/durability.md).
	SyncAlways bool
	// MaxStore caps JetStream file storage in bytes. Zero means no cap beyond
	// the disk (NoStoreLimit).
	MaxStore int64
	// ReadyTimeout bounds how long Start waits for the server to accept
	// connections. Zero means 10 seconds.
	ReadyTimeout time.Duration
	// Logging turns on the server's own log output (to stderr).
	Logging bool
	// Logger, when set, receives the server's warnings and errors (and
	// takes precedence over Logging).
	Logger *StorageLog
	// Trust runs the server in operator mode: only credentials signed for
	// the ledger account connect, each limited to its permissions. Nil runs
	// without authentication (--no-auth and most package tests).
	Trust *auth.ServerTrust
	// TLS, when set, makes clients connect over TLS (and verifies client
	// certificates when its ClientAuth says so).
	TLS *tls.Config
}

// NoStoreLimit is the JetStream storage limit of a server started without
// Config.MaxStore: far beyond any disk, so that only the disk limits it, and
// not derived from the free space at start (an exabyte; nats-server adds
// reservations to it, so not the largest int64).
const NoStoreLimit int64 = 1 << 60

// ErrNotReady is returned when the server did not accept connections in time.
var ErrNotReady = errors.New("natsserver: server not ready for connections")

// Start starts an embedded nats-server with JetStream and waits until it
// accepts client connections. A configuration Validate refuses is refused
// with its every problem.
func Start(cfg Config) (*server.Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("natsserver: %w", err)
	}
	// Creating the store up front turns an unusable path into an immediate,
	// clear error instead of a server that never becomes ready.
	if err := os.MkdirAll(cfg.StoreDir, 0o750); err != nil {
		return nil, fmt.Errorf("natsserver: store dir: %w", err)
	}
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	name := cfg.ServerName
	if name == "" {
		name = "cgledger-embedded"
	}
	opts := &server.Options{
		ServerName:   name,
		Host:         host,
		Port:         port,
		JetStream:    true,
		StoreDir:     cfg.StoreDir,
		SyncInterval: cfg.SyncInterval,
		SyncAlways:   cfg.SyncAlways,
		NoSigs:       true,
		// A single embedded node never needs the HTTP monitor or cluster ports.
		HTTPPort: 0,
	}
	// Left unset, nats-server sizes its storage limit from the disk's free
	// space at the moment it starts (75% of it) and refuses every write past
	// it ("insufficient resources", 10023) until it is restarted, even once
	// the disk has room again. A server started on a nearly full disk (serve
	// restarting itself in place after a full disk) would stay stuck: the
	// disk itself is the limit, watched by serve's reserve.
	opts.JetStreamMaxStore = NoStoreLimit
	if cfg.MaxStore > 0 {
		opts.JetStreamMaxStore = cfg.MaxStore
	}
	if cfg.Trust != nil {
		res, err := auth.NewAccountResolver(cfg.Trust.AccountJWTs, cfg.Trust.Keys)
		if err != nil {
			return nil, fmt.Errorf("natsserver: %w", err)
		}
		opts.TrustedOperators = []*jwt.OperatorClaims{cfg.Trust.Operator}
		opts.AccountResolver = res
		opts.SystemAccount = cfg.Trust.SystemAccount
	}
	if cfg.TLS != nil {
		opts.TLSConfig = cfg.TLS
		opts.TLS = true
		opts.TLSVerify = cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsserver: configure: %w", err)
	}
	if cfg.Trust == nil {
		// Tool services pull their consumer under ToolJSAPIPrefix, which
		// with credentials is an import into their project's account.
		// Without them everyone shares one account: map the prefix onto
		// the JetStream API there, so the prefix tool.consumer answers
		// works either way and a service needs no mode of its own.
		if err := srv.GlobalAccount().AddMapping(auth.ToolJSAPIPrefix+".>", "$JS.API.>"); err != nil {
			return nil, fmt.Errorf("natsserver: map %s onto the JetStream API: %w", auth.ToolJSAPIPrefix, err)
		}
	}
	switch {
	case cfg.Logger != nil:
		srv.SetLogger(cfg.Logger, false, false)
	case cfg.Logging:
		srv.ConfigureLogger()
	}
	srv.Start()
	wait := cfg.ReadyTimeout
	if wait == 0 {
		wait = 10 * time.Second
	}
	if !srv.ReadyForConnections(wait) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("%w within %s (listen %s)", ErrNotReady, wait, net.JoinHostPort(host, strconv.Itoa(port)))
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, errors.New("natsserver: JetStream did not start")
	}
	return srv, nil
}

// Port returns the TCP port a started server listens on.
func Port(srv *server.Server) int {
	if addr, ok := srv.Addr().(*net.TCPAddr); ok {
		return addr.Port
	}
	return 0
}
