// Package sdkts runs the TypeScript SDK's tests (sdk/typescript, node's own test runner) against
// the cgledger binary built from this tree, so `make test` and CI hold the SDK to the protocol
// the Go code speaks; and `cgledger conformance` against the SDK's example tool service.
package sdkts

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
)

// node is what the tests need of Node.js: the node and npm binaries, version 20 or later.
type node struct{ node, npm string }

func needNode(t *testing.T) node {
	t.Helper()
	n, err := exec.LookPath("node")
	if err != nil {
		testenv.Skip(t, "node is not installed: the TypeScript SDK's tests need Node.js 20 or later")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		testenv.Skip(t, "npm is not installed: the TypeScript SDK's tests need it")
	}
	out, err := exec.Command(n, "-p", "Number(process.versions.node.split('.')[0]) >= 20").Output()
	if err != nil || string(out) != "true\n" {
		testenv.Skip(t, "node is older than 20 (%s): the TypeScript SDK needs 20 or later", out)
	}
	return node{node: n, npm: npm}
}

// TestMain removes the binary the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var (
	buildDir  string
	ciOnce    sync.Once
	ciOK      bool
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// binary is the cgledger binary built from this tree, once per test binary.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "cgledger-sdkts-")
		if buildErr != nil {
			return
		}
		builtBin, buildErr = servetest.Build(buildDir)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func sdkDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "sdk", "typescript"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// npm runs npm with args in the SDK's directory, logging its output.
func (n node) run(t *testing.T, ctx context.Context, bin string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, n.npm, args...)
	cmd.Dir = sdkDir(t)
	cmd.Env = append(os.Environ(), "CGLEDGER_BIN="+bin, "NO_COLOR=1")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("npm %v (%s):\n%s", args, time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("npm %v: %v", args, err)
	}
}

// install runs npm ci in the SDK's directory, once per test binary.
func (n node) install(t *testing.T, ctx context.Context, bin string) {
	t.Helper()
	ciOnce.Do(func() {
		n.run(t, ctx, bin, "ci", "--no-audit", "--no-fund")
		ciOK = true
	})
	if !ciOK {
		t.Fatal("npm ci failed (see the first test's log)")
	}
}

// TestTypeScriptSDK installs the SDK's dependencies from its lockfile (npm ci) and runs npm test,
// which builds it with tsc, checks its generated types against docs/openapi.json and runs its
// tests, each starting `cgledger serve` from CGLEDGER_BIN.
func TestTypeScriptSDK(t *testing.T) {
	n := needNode(t)
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n.install(t, ctx, bin)
	n.run(t, ctx, bin, "test")
}
