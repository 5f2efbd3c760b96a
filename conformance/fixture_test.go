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
	require.Equal(t, []string{"fixture.nromal invalid_value"}, fixtureViolations(t, err), "a misspelt member is refused")

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

func fixtureViolations(t *testing.T, err error) []string {
	t.Helper()
	e, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	var got []string
	for _, v := range e.Violations {
		got = append(got, v.Field+" "+v.Code)
	}
	sort.Strings(got)
	return got
}

// TestParseFixtureTypeErrorsListedWithTheRest: a value of the wrong type or
// an unknown member does not hide the other problems (one answer lists
// every one), and a negative duration is an invalid value, not a missing
// one.
func TestParseFixtureTypeErrorsListedWithTheRest(t *testing.T) {
	_, err := conformance.ParseFixture([]byte(`
timeout_ms: soon
determinism: sometimes
colour: blue
normal: {args: [1, 2], status: done}
statuses:
  failed: {timeout_ms: {}}
long: {duration_ms: -5}
`), "echo")
	require.Equal(t, []string{
		"fixture.colour invalid_value", "fixture.determinism invalid_value", "fixture.long.duration_ms invalid_value",
		"fixture.normal.args invalid_type", "fixture.normal.status invalid_value",
		"fixture.statuses.failed.timeout_ms invalid_type", "fixture.timeout_ms invalid_type",
	}, fixtureViolations(t, err))

	_, err = conformance.ParseFixture([]byte("long: {args: {}}\n"), "echo")
	require.Equal(t, []string{"fixture.long.duration_ms required"}, fixtureViolations(t, err))

	_, err = conformance.ParseFixture([]byte("normal: [\n"), "echo")
	require.Equal(t, []string{"fixture invalid_value"}, fixtureViolations(t, err), "not YAML at all")

	f, err := conformance.ParseFixture([]byte(`{"tool":"echo","normal":{"args":{"n":[1,{"a":null}]}},"long":{"duration_ms":50}}`), "echo")
	require.NoError(t, err, "JSON is YAML")
	require.Equal(t, map[string]any{"n": []any{1, map[string]any{"a": nil}}}, f.Normal.Args)
	require.Equal(t, int64(50), f.Long.DurationMS)
}
