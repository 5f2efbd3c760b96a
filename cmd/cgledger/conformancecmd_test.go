package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/projector"
)

// TestConformanceUnknownCaseIsUsageError: a --case that names no case is a
// usage error (exit 2, docs/cli.md), found before anything is connected to:
// the server given does not exist.
func TestConformanceUnknownCaseIsUsageError(t *testing.T) {
	t.Setenv("CGLEDGER_NATS_CREDS", "")
	code, _ := runCLI(t, "conformance", "--server", "nats://127.0.0.1:1", "--project", "p1", "--tool", "echo", "--case", "normal,nosuch")
	require.Equal(t, exitUsage, code)
}

// TestAuditTurnMarksConformanceCommands: text-mode `audit turn` notes a
// command a conformance run appended with its run and case, whatever the
// spelling the views keep its headers in (lower case, docs/audit-api.md).
func TestAuditTurnMarksConformanceCommands(t *testing.T) {
	var out bytes.Buffer
	old := stdout
	stdout = &out
	defer func() { stdout = old }()
	printItems([]projector.TimelineItem{
		{Seq: 7, Kind: "command", Subject: "cg.v1.p1.conformance.cmd.tool.echo",
			Headers: map[string][]string{"cg-conformance": {"r1"}, "cg-conformance-case": {"command-inline-args"}}, Data: []byte(`{}`)},
		{Seq: 8, Kind: "command", Subject: "cg.v1.p1.main.cmd.tool.echo", Data: []byte(`{}`)},
	})
	require.Equal(t, 1, strings.Count(out.String(), "conformance r1/command-inline-args"), out.String())
}
