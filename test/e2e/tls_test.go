package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// writeCert writes a certificate (signed by parent, or self-signed) and its
// key, and returns their paths.
func writeCert(t *testing.T, dir, name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (certPath, keyPath string, cert *x509.Certificate, key *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	require.NoError(t, err)
	cert, err = x509.ParseCertificate(der)
	require.NoError(t, err)
	kb, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	require.NoError(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600))
	return certPath, keyPath, cert, key
}

// TestServeMutualTLS: with a certificate, key and CA, serve speaks TLS on
// NATS and HTTP and requires client certificates from that CA; the client
// verbs follow with the same flags.
func TestServeMutualTLS(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	caPath, _, ca, caKey := writeCert(t, dir, "ca", &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cgledger test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	// serve's certificate also authenticates serve's own connection to its
	// embedded server, so it carries both usages.
	srvCert, srvKey, _, _ := writeCert(t, dir, "server", &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}, ca, caKey)
	cliCert, cliKey, _, _ := writeCert(t, dir, "client", &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "cli"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}, ca, caKey)

	data := t.TempDir()
	natsPort, httpPort := servetest.FreePort(t), servetest.FreePort(t)
	cmd := exec.Command(binary, "serve", "--data", data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", natsPort),
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort), "--tls-cert", srvCert, "--tls-key", srvKey, "--tls-ca", caPath)
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("serve log:\n%s", log.String())
		}
	})
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	pair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	require.NoError(t, err)
	httpsURL := fmt.Sprintf("https://127.0.0.1:%d", httpPort)
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}
	require.Eventually(t, func() bool {
		resp, err := withCert.Get(httpsURL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 50*time.Millisecond, "serve becomes ready over HTTPS")

	// Without a client certificate: refused by TLS, on HTTP and NATS.
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	_, err = noCert.Get(httpsURL + "/readyz")
	require.Error(t, err)
	admin := filepath.Join(data, "auth", "admin.creds")
	_, err = nats.Connect(fmt.Sprintf("tls://127.0.0.1:%d", natsPort), nats.UserCredentials(admin), nats.RootCAs(caPath))
	require.Error(t, err)

	s := addrs(natsPort, httpPort)
	s.Data = data
	ctxEnv := []string{"CGLEDGER_NATS_URL=" + fmt.Sprintf("tls://127.0.0.1:%d", natsPort), "CGLEDGER_SERVER=" + httpsURL}
	run := func(args ...string) (string, int) {
		c := exec.Command(binary, args...)
		c.Env = append(append(os.Environ(), ctxEnv...), "CGLEDGER_DATA="+s.Data)
		out, err := c.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		require.NoError(t, err)
		return string(out), 0
	}
	tlsFlags := []string{"--tls-ca", caPath, "--tls-cert", cliCert, "--tls-key", cliKey}
	out, code := run(append([]string{"call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"tls"}`}, tlsFlags...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"text":"tls"`)
	out, code = run(append([]string{"verify"}, tlsFlags...)...)
	require.Equal(t, 0, code, out)
	_, code = run("verify", "--tls-ca", caPath)
	require.NotEqual(t, 0, code, "no client certificate, no answer")
}
