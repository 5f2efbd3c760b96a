package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

const manifestBase = `tool_name: pay
parameters: {type: object}
target_subject: "cg.v1.{project_id}.{channel_id}.cmd.tool.pay"
after_execution: suspend
`

// TestManifestFieldsAreValidatedWithEveryViolation: version, owner,
// result_schema and health are checked with the rest of the definition,
// and every problem of each is listed.
func TestManifestFieldsAreValidatedWithEveryViolation(t *testing.T) {
	_, err := protocol.ParseToolYAML("proj", []byte(manifestBase+`version: "v01.2.x-beta..1+b@d"
result_schema: {type: 12, required: "no", properties: {n: {minimum: "x"}}}
health: {fail_fast_after_ms: 0}
owner: 7
`))
	e, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, protocol.CodeBadRequest, e.Code)
	got := map[string]int{}
	for _, v := range e.Violations {
		got[v.Field]++
	}
	// v prefix; two numbers; major leading zero; patch missing is the
	// count; pre-release empty identifier; build metadata '@'.
	require.GreaterOrEqual(t, got["tool.version"], 5, "every semver problem: %+v", e.Violations)
	require.Equal(t, 1, got["tool.result_schema.required"], "%+v", e.Violations)
	require.Equal(t, 1, got["tool.result_schema.properties.n.minimum"], "%+v", e.Violations)
	require.GreaterOrEqual(t, got["tool.result_schema.type"], 1, "%+v", e.Violations)
	require.Equal(t, 1, got["tool.health.fail_fast_after_ms"], "%+v", e.Violations)
	require.Equal(t, 1, got["tool.owner"], "%+v", e.Violations)

	for _, bad := range []string{"1.2", "1.2.3.4", "01.2.3", "1.2.3-", "1.2.3-01", "1.2.3+", "v1.2.3", "1.x.3", ""} {
		var vs protocol.Violations
		protocol.CheckSemver(&vs, "version", bad)
		require.NotEmpty(t, vs, "%q is not semver", bad)
	}
	for _, good := range []string{"0.0.0", "1.4.2", "10.20.30", "1.0.0-alpha.1", "1.0.0-0.3.7", "1.0.0+20130313144700", "1.0.0-beta+exp.sha.5114f85", "1.0.0-x-y-z.--"} {
		var vs protocol.Violations
		protocol.CheckSemver(&vs, "version", good)
		require.Empty(t, vs, "%q is semver", good)
	}
}

// TestManifestFieldsAreOptionalAndKeptAsGiven: a definition without the new
// fields encodes exactly as before (stored definitions keep their bytes);
// one with them keeps them.
func TestManifestFieldsAreOptionalAndKeptAsGiven(t *testing.T) {
	d, err := protocol.ParseToolYAML("proj", []byte(manifestBase))
	require.NoError(t, err)
	b, err := json.Marshal(d)
	require.NoError(t, err)
	for _, k := range []string{`"version"`, `"owner"`, `"result_schema"`, `"health"`} {
		require.NotContains(t, string(b), k)
	}

	d, err = protocol.ParseToolYAML("proj", []byte(manifestBase+`version: "1.4.2-rc.1+build.7"
owner: "@team-payments"
result_schema: {type: object, required: [id], properties: {id: {type: string}}}
health: {fail_fast_after_ms: 5000}
`))
	require.NoError(t, err)
	require.Equal(t, "1.4.2-rc.1+build.7", d.Version)
	require.Equal(t, "@team-payments", d.Owner)
	require.JSONEq(t, `{"type":"object","required":["id"],"properties":{"id":{"type":"string"}}}`, string(d.ResultSchema))
	require.Equal(t, &protocol.ToolHealth{FailFastAfterMS: 5000}, d.Health)
	s, err := d.CompileResultSchema()
	require.NoError(t, err)
	require.Error(t, s.Validate(map[string]any{}))
}
