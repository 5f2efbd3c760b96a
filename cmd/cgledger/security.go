package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/internal/auth"
)

// adminCredsTTL bounds the embedded admin credential. serve re-issues it on
// every start, so a copy taken off the machine stops working within this.
const adminCredsTTL = 30 * 24 * time.Hour

// serveAuth is the identity set-up of one serve run.
type serveAuth struct {
	keys   *auth.Keys
	trust  *auth.ServerTrust
	ledger *auth.Credential
	policy *httpapi.Policy
}

func authDir(data string) string { return filepath.Join(data, "auth") }

// setupAuth loads (or, on first start, creates) the keys in the data
// directory, issues the ledger's own credential in memory and writes the
// admin credential the CLI finds by default.
func setupAuth(data string, embedded bool, log *slog.Logger) (*serveAuth, error) {
	dir := authDir(data)
	var keys *auth.Keys
	var err error
	if embedded {
		keys, err = auth.LoadOrCreateKeys(dir)
	} else {
		keys, err = auth.LoadAccountKeys(dir)
	}
	if err != nil {
		return nil, err
	}
	sa := &serveAuth{keys: keys}
	if embedded {
		if sa.trust, err = keys.Trust(); err != nil {
			return nil, err
		}
	}
	is, err := keys.Issuer()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if sa.ledger, err = is.Issue(auth.Grant{Role: auth.RoleLedger, Label: "cgledger serve"}, 0, now); err != nil {
		return nil, err
	}
	admin, err := is.Issue(auth.Grant{Role: auth.RoleAdmin, Project: auth.AllProjects, Label: "embedded admin"}, adminCredsTTL, now)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, auth.AdminCredsFile)
	if err := auth.WriteSecret(path, admin.Creds); err != nil {
		return nil, err
	}
	v, err := keys.Verifier()
	if err != nil {
		return nil, err
	}
	sa.policy = &httpapi.Policy{Verifier: v}
	log.Info("authentication on", "admin_creds", path, "admin_expires", admin.Expires.Format(time.RFC3339))
	return sa, nil
}

// loadTLS builds a TLS config from PEM files. With a CA, peers must present
// certificates signed by it (servers verify clients; clients verify servers).
func loadTLS(certFile, keyFile, caFile string, server bool) (*tls.Config, error) {
	if certFile == "" && caFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: load %s/%s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("tls: read CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: %s holds no PEM certificate", caFile)
		}
		if server {
			cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		} else {
			cfg.RootCAs = pool
		}
	}
	return cfg, nil
}

// streamMarker records which stream the views in a data directory were built
// from, so a deleted and re-created stream is noticed instead of silently
// served as an empty ledger.
type streamMarker struct {
	Stream  string    `json:"stream"`
	Created time.Time `json:"created"`
}

const markerFile = "ledger-stream.json"

// errLedgerMissing says the ledger this data directory knows is gone.
var errLedgerMissing = errors.New("ledger stream missing")

// checkLedgerStream refuses a ledger whose stream is missing, re-created or
// behind the views. A new stream is created only for a data directory that
// has never seen one. recorded says the data directory already names its
// stream (recordLedgerStream need not run).
func checkLedgerStream(ctx context.Context, js jetstream.JetStream, stream, data string, viewsApplied uint64) (recorded bool, err error) {
	var known *streamMarker
	if b, err := os.ReadFile(filepath.Join(data, markerFile)); err == nil {
		known = &streamMarker{}
		if err := json.Unmarshal(b, known); err != nil {
			return false, fmt.Errorf("read %s: %w", markerFile, err)
		}
	}
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if known != nil || viewsApplied > 0 {
			return false, fmt.Errorf("%w: %s is not on this NATS server (or not visible to this identity), but the views in %s were built from it up to seq %d; "+
				"restore the stream from backup or replay an export (see docs/security.md, \"Recovery\"). A data directory written without authentication needs --no-auth",
				errLedgerMissing, stream, data, viewsApplied)
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read stream %s: %w", stream, err)
	}
	info := st.CachedInfo()
	if known != nil && !known.Created.Equal(info.Created) {
		return false, fmt.Errorf("%w: %s was created at %s, but the views in %s were built from the one created at %s: it was deleted and re-created",
			errLedgerMissing, stream, info.Created.Format(time.RFC3339Nano), data, known.Created.Format(time.RFC3339Nano))
	}
	if info.State.LastSeq < viewsApplied {
		return false, fmt.Errorf("%w: %s ends at seq %d, behind the views in %s (seq %d)", errLedgerMissing, stream, info.State.LastSeq, data, viewsApplied)
	}
	return known != nil, nil
}

// recordLedgerStream writes the marker once the stream exists, on the first
// start of a data directory.
func recordLedgerStream(ctx context.Context, js jetstream.JetStream, stream, data string) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("read stream %s: %w", stream, err)
	}
	b, _ := json.Marshal(streamMarker{Stream: stream, Created: st.CachedInfo().Created})
	if err := os.MkdirAll(data, 0o750); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	return auth.WriteSecret(filepath.Join(data, markerFile), b)
}
