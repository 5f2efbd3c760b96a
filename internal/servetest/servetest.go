// Package servetest runs the cgledger binary for tests that treat it as a
// process (end-to-end tests, the OpenAPI check against a real server), as
// net/http/httptest serves handlers: it builds the binary, finds free
// loopback ports and collects a child process's log.
package servetest

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Build compiles cmd/cgledger from this tree into dir and returns the
// binary's path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "cgledger")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/cgledger/cgledger/cmd/cgledger").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build cgledger: %v: %s", err, out)
	}
	return bin, nil
}

// FreePort returns a loopback TCP port nothing listens on now.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("servetest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// LogBuffer is a child process's log: its output copier writes while the
// test reads.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
