package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/httpclient"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/protocol"
)

// clientFlags are the connection settings every client verb shares (one
// grammar: docs/cli.md, "Client verbs").
type clientFlags struct {
	natsURL  string
	server   string
	creds    string
	user     string
	password string
	token    string
	tlsCA    string
	tlsCert  string
	tlsKey   string
	asJSON   bool

	// source says where each connection setting came from, for errors.
	source map[string]string
	fs     *flag.FlagSet

	// refusedCtx ends when the server refuses one of this client's
	// publishes (a permissions violation, which NATS reports on the
	// connection, not to the request): waits end at once with the reason.
	refusedCtx context.Context
	refuse     context.CancelCauseFunc

	// answer is the HTTP API's last answer as received (api).
	answer []byte
}

// errRefused marks the server's refusal of the credential: the operation
// ran and was told no (exit 1).
var errRefused = errors.New("refused")

// errBadArg marks a setting or file named on the command line that cannot
// be used (exit 2).
var errBadArg = errors.New("bad argument")

// context returns a context for one verb's work, ended after d or as soon
// as the server refuses a publish.
func (c *clientFlags) context(d time.Duration) (context.Context, context.CancelFunc) {
	parent := c.refusedCtx
	if parent == nil {
		parent = context.Background()
	}
	return context.WithTimeout(parent, d)
}

// explain replaces an error caused by ctx ending with the reason it ended,
// when that is a refusal by the server.
func (c *clientFlags) explain(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, errRefused) {
		return cause
	}
	return err
}

// defaultCreds is the admin credential serve writes on the embedded default,
// found under CGLEDGER_DATA (default ./data) when no credential is named.
func defaultCreds() string {
	if v := os.Getenv("CGLEDGER_NATS_CREDS"); v != "" {
		return v
	}
	p := filepath.Join(envOr("CGLEDGER_DATA", "./data"), "auth", auth.AdminCredsFile)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// register adds the connection flags to fs. Every client verb takes all of
// them, whether it talks NATS, HTTP or both, so one set of settings (or one
// environment) serves every verb.
func (c *clientFlags) register(fs *flag.FlagSet) {
	c.fs = fs
	c.source = map[string]string{}
	c.refusedCtx, c.refuse = context.WithCancelCause(context.Background())
	str := func(p *string, name, env, def, usage string) {
		v, from := def, "the default"
		if e := os.Getenv(env); e != "" {
			v, from = e, "environment variable "+env
		}
		c.source[name] = from
		if def == "" {
			def = "none"
		}
		// Help shows the documented default, not what the environment made
		// of it.
		fs.StringVar(p, name, v, usage+" (env "+env+"; default "+def+")")
	}
	str(&c.natsURL, "nats-url", "CGLEDGER_NATS_URL", "nats://127.0.0.1:4222", "NATS URL of the running server")
	str(&c.server, "server", "CGLEDGER_SERVER", "http://127.0.0.1:8080", "HTTP base URL of the running server")
	fs.StringVar(&c.creds, "creds", defaultCreds(), "credentials FILE from cgledger creds issue, used for NATS and as the HTTP bearer token (env CGLEDGER_NATS_CREDS; default ./data/auth/admin.creds if it exists, under CGLEDGER_DATA)")
	c.source["creds"] = "the default (" + filepath.Join("./data", "auth", auth.AdminCredsFile) + "; set CGLEDGER_DATA to serve's data directory)"
	if d := os.Getenv("CGLEDGER_DATA"); d != "" {
		c.source["creds"] = "the default (" + filepath.Join(d, "auth", auth.AdminCredsFile) + ", under CGLEDGER_DATA)"
	}
	if os.Getenv("CGLEDGER_NATS_CREDS") != "" {
		c.source["creds"] = "environment variable CGLEDGER_NATS_CREDS"
	}
	fs.StringVar(&c.creds, "nats-creds", c.creds, "same as --creds (default: that of --creds)")
	str(&c.user, "nats-user", "CGLEDGER_NATS_USER", "", "NATS user, for a server with user and password authentication")
	str(&c.password, "nats-password", "CGLEDGER_NATS_PASSWORD", "", "NATS password of --nats-user (prefer the environment variable)")
	str(&c.token, "nats-token", "CGLEDGER_NATS_TOKEN", "", "NATS token, for a server with token authentication (prefer the environment variable)")
	str(&c.tlsCA, "tls-ca", "CGLEDGER_TLS_CA", "", "PEM CA bundle to verify the server's NATS and HTTPS certificates")
	str(&c.tlsCert, "tls-cert", "CGLEDGER_TLS_CERT", "", "PEM client certificate, when the server requires one")
	str(&c.tlsKey, "tls-key", "CGLEDGER_TLS_KEY", "", "PEM key of --tls-cert")
	fs.BoolVar(&c.asJSON, "json", false, "print JSON")
}

// from says where setting name's value came from: a flag the user gave, an
// environment variable or the default.
func (c *clientFlags) from(name string) string {
	set := false
	if c.fs != nil {
		c.fs.Visit(func(f *flag.Flag) {
			if f.Name == name || (name == "creds" && f.Name == "nats-creds") {
				set = true
			}
		})
	}
	if set {
		return "flag --" + name
	}
	if s := c.source[name]; s != "" {
		return s
	}
	return "the default"
}

func (c *clientFlags) connect() (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("cgledger-cli"), nats.Timeout(5 * time.Second)}
	inboxPrefix := nats.InboxPrefix
	if c.creds != "" {
		_, inbox, err := auth.ReadCreds(c.creds)
		if err != nil {
			return nil, fmt.Errorf("%w: credentials %s (from %s): %v", errBadArg, c.creds, c.from("creds"), err)
		}
		opts = append(opts, nats.UserCredentials(c.creds), nats.CustomInboxPrefix(inbox))
		inboxPrefix = inbox + "."
	}
	if c.refuse != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				c.refuse(c.refusal(err, inboxPrefix))
			}
		}))
	}
	if c.user != "" {
		opts = append(opts, nats.UserInfo(c.user, c.password))
	}
	if c.token != "" {
		opts = append(opts, nats.Token(c.token))
	}
	tc, err := loadTLS(c.tlsCert, c.tlsKey, c.tlsCA, false)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	nc, err := nats.Connect(c.natsURL, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || strings.Contains(err.Error(), "Authorization") || strings.Contains(err.Error(), "expired") {
			return nil, fmt.Errorf("%w: NATS at %s refused the %s (from %s): %v; issue a credential with cgledger creds issue and pass --creds",
				errRefused, c.natsURL, c.credName(), c.from("creds"), err)
		}
		return nil, fmt.Errorf("%w: cannot reach NATS at %s (from %s): %v; is cgledger serve running there? Set --nats-url or CGLEDGER_NATS_URL", errUnreachable, c.natsURL, c.from("nats-url"), err)
	}
	return nc, nil
}

// refusal is the error a permissions violation reported on the connection
// ends a verb with. A refused subscription to the client's own reply inbox
// is not the credential's choice of project or role (every credential may
// take its inbox): it comes from the server the client reconnected to, a
// serve restarted while the verb waited, so the message says to run it
// again rather than to issue another credential.
func (c *clientFlags) refusal(err error, inboxPrefix string) error {
	if strings.Contains(err.Error(), `Subscription to "`+inboxPrefix) {
		return fmt.Errorf("%w: %v: NATS refused this client's reply inbox after it reconnected, which a cgledger serve restarted while the command waited does (the %s is not at fault); run the command again",
			errRefused, err, c.credName())
	}
	return fmt.Errorf("%w: %v: the %s (from %s) may not do this; issue one of the right project, role and agent or tool (cgledger creds issue) and pass --creds",
		errRefused, err, c.credName(), c.from("creds"))
}

// errUnreachable marks failures to reach the server (exit code 3).
var errUnreachable = errors.New("server unreachable")

// apiError is an HTTP error answer from the server: the protocol's error
// (code, message, violations), so errors.Is matches its sentinels.
type apiError struct {
	Status int
	// Hint says what to do, when the client can tell.
	Hint string
	Err  protocol.Error
}

// Error renders the server's code, message and violations, one a line.
func (e *apiError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", e.Err.Code, e.Err.Message)
	for _, v := range e.Err.Violations {
		fmt.Fprintf(&b, "\n  %s: %s (%s)", v.Field, v.Message, v.Code)
	}
	if e.Hint != "" {
		b.WriteString("\n  " + e.Hint)
	}
	return b.String()
}

// Unwrap is the protocol error the server answered.
func (e *apiError) Unwrap() error { return &e.Err }

// api returns a client of the server's HTTP API with the bearer token of
// --creds and the TLS settings. Every answer it decodes is kept in answer
// first, as received, for --json to print byte for byte.
func (c *clientFlags) api() (*httpclient.Client, error) {
	opts := []httpclient.Option{httpclient.WithAnswerHook(func(b []byte) { c.answer = b })}
	if c.creds != "" {
		tok, _, err := auth.ReadCreds(c.creds)
		if err != nil {
			return nil, fmt.Errorf("%w: credentials %s (from %s): %v", errBadArg, c.creds, c.from("creds"), err)
		}
		opts = append(opts, httpclient.WithToken(tok))
	}
	tc, err := loadTLS(c.tlsCert, c.tlsKey, c.tlsCA, false)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, httpclient.WithHTTPClient(&http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}}))
	}
	return httpclient.New(c.server, opts...), nil
}

// httpErr turns an error of the HTTP client into the CLI's: an unreachable
// server (exit 3) that says which setting named it, or an *apiError with
// the server's code, message and violations and, for 401 and 403, the
// credential and where it came from. An error answer that is not a problem
// is returned as it is.
func (c *clientFlags) httpErr(err error) error {
	var te *httpclient.TransportError
	if errors.As(err, &te) {
		if te.Reading {
			return fmt.Errorf("%w: reading %s: %v", errUnreachable, te.URL, te.Err)
		}
		return fmt.Errorf("%w: cannot reach HTTP at %s (from %s): %v; is `cgledger serve` running there? Set --server or CGLEDGER_SERVER", errUnreachable, c.server, c.from("server"), te.Err)
	}
	var p *httpclient.Problem
	if !errors.As(err, &p) || p.Code == "" {
		return err
	}
	ae := &apiError{Status: p.Status, Err: protocol.Error{Code: p.Code, Message: p.Detail, Violations: p.Violations, Seq: p.RejectionSeq}}
	if p.Status == http.StatusUnauthorized || p.Status == http.StatusForbidden {
		cred := "no credential"
		if c.creds != "" {
			cred = "credential " + c.creds
		}
		ae.Hint = fmt.Sprintf("the server refused %s (from %s): pass --creds with a credential of the right project and role (`cgledger creds issue`)", cred, c.from("creds"))
	}
	return ae
}

// exitFor maps an error to an exit code.
func exitFor(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errBadArg):
		return exitUsage
	case errors.Is(err, errRefused):
		return exitFailed
	case errors.Is(err, errUnreachable), errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout):
		return exitUnreachable
	}
	return exitFailed
}

func printJSON(v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Fprintln(stdout, string(b))
}

// asOf adds the as-of flags to a verb.
type asOfFlags struct {
	seq    uint64
	seqSet bool
	at     string
}

func (a *asOfFlags) register(fs *flag.FlagSet) {
	fs.Func("as-of-seq", "answer as the views stood right after this ledger sequence (1 or more)", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("want a ledger sequence (1 or more)")
		}
		a.seq, a.seqSet = n, true
		return nil
	})
	fs.StringVar(&a.at, "as-of", "", "answer as of this time (RFC 3339, e.g. 2026-11-22T10:00:00Z)")
}

// asOf is the as-of point the flags name (zero: now).
func (a *asOfFlags) asOf() (httpclient.AsOf, error) {
	var at httpclient.AsOf
	if a.seqSet && a.seq == 0 {
		// Sequences start at 1: "as of 0" is not "now".
		return at, fmt.Errorf("--as-of-seq must be a ledger sequence (1 or more), got 0")
	}
	at.Seq = a.seq
	if a.at != "" {
		t, err := time.Parse(time.RFC3339Nano, a.at)
		if err != nil {
			return httpclient.AsOf{}, fmt.Errorf("--as-of %q: want an RFC 3339 time such as 2026-11-22T10:00:00Z", a.at)
		}
		at.Time = t
	}
	return at, nil
}

// credName names the credential in use for messages.
func (c *clientFlags) credName() string {
	if c.creds == "" {
		return "connection without a credential"
	}
	return "credential " + c.creds
}
