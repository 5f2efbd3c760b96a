package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/internal/auth"
)

// clientFlags are the flags every client verb shares.
type clientFlags struct {
	natsURL  string
	server   string
	creds    string
	tlsCA    string
	tlsCert  string
	tlsKey   string
	asJSON   bool
	deadline time.Duration
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

func (c *clientFlags) register(fs *flag.FlagSet, withNATS, withHTTP bool) {
	if withNATS {
		fs.StringVar(&c.natsURL, "nats-url", envOr("CGLEDGER_NATS_URL", "nats://127.0.0.1:4222"), "NATS URL of the running server (env CGLEDGER_NATS_URL)")
	}
	if withHTTP {
		fs.StringVar(&c.server, "server", envOr("CGLEDGER_SERVER", "http://127.0.0.1:8080"), "HTTP base URL of the running server (env CGLEDGER_SERVER)")
	}
	fs.StringVar(&c.creds, "creds", defaultCreds(), "credentials file from `cgledger creds issue`, used for NATS and as the HTTP bearer token (env CGLEDGER_NATS_CREDS; default: ./data/auth/admin.creds when it exists, under CGLEDGER_DATA)")
	fs.StringVar(&c.creds, "nats-creds", c.creds, "same as --creds")
	fs.StringVar(&c.tlsCA, "tls-ca", os.Getenv("CGLEDGER_TLS_CA"), "PEM CA bundle to verify the server's NATS and HTTPS certificates (env CGLEDGER_TLS_CA)")
	fs.StringVar(&c.tlsCert, "tls-cert", os.Getenv("CGLEDGER_TLS_CERT"), "PEM client certificate, when the server requires one (env CGLEDGER_TLS_CERT)")
	fs.StringVar(&c.tlsKey, "tls-key", os.Getenv("CGLEDGER_TLS_KEY"), "PEM key of --tls-cert (env CGLEDGER_TLS_KEY)")
	fs.BoolVar(&c.asJSON, "json", false, "print JSON")
}

func (c *clientFlags) connect() (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("cgledger-cli"), nats.Timeout(5 * time.Second)}
	if c.creds != "" {
		_, inbox, err := auth.ReadCreds(c.creds)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserCredentials(c.creds), nats.CustomInboxPrefix(inbox))
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
		return nil, fmt.Errorf("cannot reach NATS at %s: %w", c.natsURL, err)
	}
	return nc, nil
}

// errUnreachable marks failures to reach the server (exit code 3).
var errUnreachable = errors.New("server unreachable")

// apiError is an HTTP error body from the server.
type apiError struct {
	Status int
	Body   struct {
		Error struct {
			Code       string `json:"code"`
			Message    string `json:"message"`
			Violations []struct {
				Field   string `json:"field"`
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"violations"`
		} `json:"error"`
	}
}

// Error renders the server's code, message and violations.
func (e *apiError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", e.Body.Error.Code, e.Body.Error.Message)
	for _, v := range e.Body.Error.Violations {
		fmt.Fprintf(&b, "\n  %s: %s (%s)", v.Field, v.Message, v.Code)
	}
	return b.String()
}

// httpDo sends a request to the server and decodes a JSON answer into out.
func (c *clientFlags) httpDo(ctx context.Context, method, path string, q url.Values, body io.Reader, out any) error {
	u := strings.TrimRight(c.server, "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	hc, err := c.httpClient(req)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", errUnreachable, c.server, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%w: reading %s: %v", errUnreachable, u, err)
	}
	if resp.StatusCode >= 400 {
		ae := &apiError{Status: resp.StatusCode}
		if json.Unmarshal(raw, &ae.Body) != nil || ae.Body.Error.Code == "" {
			return fmt.Errorf("%s %s: HTTP %d: %s", method, u, resp.StatusCode, strings.TrimSpace(string(raw)))
		}
		return ae
	}
	if out == nil {
		return nil
	}
	if raw2, ok := out.(*json.RawMessage); ok {
		*raw2 = raw
		return nil
	}
	return json.Unmarshal(raw, out)
}

// httpClient adds the bearer token to req and returns a client with the TLS
// settings.
func (c *clientFlags) httpClient(req *http.Request) (*http.Client, error) {
	if c.creds != "" {
		tok, _, err := auth.ReadCreds(c.creds)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	tc, err := loadTLS(c.tlsCert, c.tlsKey, c.tlsCA, false)
	if err != nil || tc == nil {
		return http.DefaultClient, err
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}}, nil
}

// exitFor maps an error to an exit code.
func exitFor(err error) int {
	switch {
	case err == nil:
		return exitOK
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
	seq uint64
	at  string
}

func (a *asOfFlags) register(fs *flag.FlagSet) {
	fs.Uint64Var(&a.seq, "as-of-seq", 0, "answer as the views stood right after this ledger sequence")
	fs.StringVar(&a.at, "as-of", "", "answer as of this time (RFC 3339, e.g. 2026-11-22T10:00:00Z)")
}

func (a *asOfFlags) values() (url.Values, error) {
	q := url.Values{}
	if a.seq > 0 {
		q.Set("as_of_seq", fmt.Sprint(a.seq))
	}
	if a.at != "" {
		if _, err := time.Parse(time.RFC3339Nano, a.at); err != nil {
			return nil, fmt.Errorf("--as-of %q: want an RFC 3339 time such as 2026-11-22T10:00:00Z", a.at)
		}
		q.Set("as_of", a.at)
	}
	return q, nil
}
