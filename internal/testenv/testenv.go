// Package testenv lets a test that needs something of the machine (a
// binary, root to mount a file system) skip where it is missing, except in
// CI: with CGLEDGER_CI=1 (.ci/run sets it) a missing need fails the test,
// so CI never passes by skipping.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// Skip skips the test, or fails it under CGLEDGER_CI=1.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CGLEDGER_CI") == "1" {
		t.Fatalf("required in CI (CGLEDGER_CI=1): %s", msg)
	}
	t.Skip(msg)
}
