package protocol

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func fieldCodes(vs Violations) []string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, v.Field+" "+v.Code)
	}
	return out
}

const confSubject = "cg.v1.p1.conformance.cmd.tool.echo"

// A null payload is a JSON value like any other (docs/protocol.md,
// conformance.command): it is written as given.
func TestParseConformanceCommandNullPayload(t *testing.T) {
	r, vs := ParseConformanceCommand([]byte(`{"project_id":"p1","run":"r1","case":"c1","subject":"` + confSubject + `","payload":null}`))
	require.Empty(t, vs)
	require.Equal(t, "null", string(r.Payload))
	_, vs = ParseConformanceCommand([]byte(`{"project_id":"p1","run":"r1","case":"c1","subject":"` + confSubject + `"}`))
	require.Equal(t, []string{"body.payload required"}, fieldCodes(vs))
}

// An oversized payload is named on body.payload, not on the whole body,
// and every bad header name is named on its own path.
func TestParseConformanceCommandPathsOfViolations(t *testing.T) {
	big := `"` + strings.Repeat("x", 769<<10) + `"`
	_, vs := ParseConformanceCommand([]byte(`{"project_id":"p1","run":"r1","case":"c1","subject":"` + confSubject + `","payload":` + big + `}`))
	require.Equal(t, []string{"body.payload too_large"}, fieldCodes(vs))

	_, vs = ParseConformanceCommand([]byte(`{"project_id":"p1","run":"r1","case":"c1","subject":"` + confSubject + `","headers":{"Bad Name":["1"],"x:y":["2"]},"payload":{}}`))
	require.ElementsMatch(t, []string{"body.headers.Bad Name invalid_value", "body.headers.x:y invalid_value"}, fieldCodes(vs))

	// A body far past any payload the limit allows is still refused whole.
	huge := fmt.Sprintf(`{"project_id":"p1","payload":"%s"}`, strings.Repeat("x", 900<<10))
	_, vs = ParseConformanceCommand([]byte(huge))
	require.Equal(t, []string{"body too_large"}, fieldCodes(vs))
}

// from_seq 0 is a value out of its range, not a value of the wrong type.
func TestParseConformanceObserveFromSeq(t *testing.T) {
	_, vs := ParseConformanceObserve([]byte(`{"project_id":"p1","from_seq":0}`))
	require.Equal(t, []string{"body.from_seq invalid_value"}, fieldCodes(vs))
	_, vs = ParseConformanceObserve([]byte(`{"project_id":"p1","from_seq":"a"}`))
	require.Equal(t, []string{"body.from_seq invalid_type"}, fieldCodes(vs))
	_, vs = ParseConformanceObserve([]byte(`{"project_id":"p1","from_seq":-3}`))
	require.Equal(t, []string{"body.from_seq invalid_value"}, fieldCodes(vs))
}
