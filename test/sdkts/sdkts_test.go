// Package sdkts runs the TypeScript SDK's tests (sdk/typescript, node's own test runner) against
// the cgledger binary built from this tree, so `make test` and CI hold the SDK to the protocol
// the Go code speaks.
package sdkts

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
)

// TestTypeScriptSDK installs the SDK's dependencies from its lockfile (npm ci) and runs npm test,
// which builds it with tsc, checks its generated types against docs/openapi.json and runs its
// tests, each starting `cgledger serve` from CGLEDGER_BIN.
func TestTypeScriptSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Skip(t, "node is not installed: the TypeScript SDK's tests need Node.js 20 or later")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		testenv.Skip(t, "npm is not installed: the TypeScript SDK's tests need it")
	}
	out, err := exec.Command(node, "-p", "Number(process.versions.node.split('.')[0]) >= 20").Output()
	if err != nil || string(out) != "true\n" {
		testenv.Skip(t, "node is older than 20 (%s): the TypeScript SDK needs 20 or later", out)
	}
	bin, err := servetest.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "sdk", "typescript"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"ci", "--no-audit", "--no-fund"}, {"test"}} {
		cmd := exec.CommandContext(ctx, npm, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGLEDGER_BIN="+bin, "NO_COLOR=1")
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("npm %v (%s):\n%s", args, time.Since(start).Round(time.Millisecond), out)
		if err != nil {
			t.Fatalf("npm %v: %v", args, err)
		}
	}
}
