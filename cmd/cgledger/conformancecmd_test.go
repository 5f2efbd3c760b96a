package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConformanceUnknownCaseIsUsageError: a --case that names no case is a
// usage error (exit 2, docs/cli.md), found before anything is connected to:
// the server given does not exist.
func TestConformanceUnknownCaseIsUsageError(t *testing.T) {
	t.Setenv("CGLEDGER_NATS_CREDS", "")
	code, _ := runCLI(t, "conformance", "--server", "nats://127.0.0.1:1", "--project", "p1", "--tool", "echo", "--case", "normal,nosuch")
	require.Equal(t, exitUsage, code)
}
