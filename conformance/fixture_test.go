package conformance_test

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/conformance"
	"github.com/cgledger/cgledger/protocol"
)

// TestParseFixtureListsEveryProblem: a fixture is refused with one
// violation per problem, and an empty one gets the defaults.
func TestParseFixtureListsEveryProblem(t *testing.T) {
	_, err := conformance.ParseFixture([]byte(`
tool: other
channel: "a.b"
determinism: sometimes
timeout_ms: -1
normal: {status: done}
statuses:
  broken: {args: {}}
  failed: {status: success}
long: {args: {ms: 1}}
`), "echo")
	e, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	var got []string
	for _, v := range e.Violations {
		got = append(got, v.Field+" "+v.Code)
	}
	sort.Strings(got)
	require.Equal(t, []string{
		"fixture.channel invalid_token", "fixture.determinism invalid_value", "fixture.long.duration_ms required",
		"fixture.normal.status invalid_value", "fixture.statuses.broken invalid_value", "fixture.statuses.failed.status mismatch",
		"fixture.timeout_ms invalid_value", "fixture.tool mismatch",
	}, got)

	_, err = conformance.ParseFixture([]byte("nromal: {}\n"), "echo")
	require.ErrorContains(t, err, "field nromal not found", "a misspelt member is refused")

	f, err := conformance.ParseFixture(nil, "echo")
	require.NoError(t, err)
	require.Equal(t, "echo", f.Tool)
	require.Equal(t, "echo", f.ToolName)
	require.Equal(t, "conformance", f.Channel)
	require.Equal(t, int64(10_000), f.TimeoutMS)
	require.Equal(t, protocol.StatusSuccess, f.Normal.Status)
	require.NotNil(t, f.Normal.Args)
}

// TestDocsListEveryCase: docs/conformance.md's table names every case a
// run takes, so the documentation cannot fall behind the checker.
func TestDocsListEveryCase(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "docs", "conformance.md"))
	require.NoError(t, err)
	for _, c := range conformance.Cases() {
		require.Contains(t, string(b), "`"+c+"`", "docs/conformance.md documents case %s", c)
	}
}
