package projector

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestInboxListLimitKinds: a limit that is not an integer literal (a
// fraction, an exponent, a string) is invalid_type; an integer out of range
// (negative, past the maximum, past int64) is invalid_value; null counts as
// absent, as every optional field of the protocol does (docs/protocol.md).
func TestInboxListLimitKinds(t *testing.T) {
	for limit, code := range map[string]string{
		`1.5`: protocol.VInvalidType, `100.0`: protocol.VInvalidType, `1e2`: protocol.VInvalidType, `1E2`: protocol.VInvalidType,
		`"10"`: protocol.VInvalidType, `true`: protocol.VInvalidType, `[1]`: protocol.VInvalidType,
		`-1`: protocol.VInvalidValue, `1001`: protocol.VInvalidValue, `99999999999999999999999`: protocol.VInvalidValue,
	} {
		_, err := parseInboxList([]byte(`{"project_id":"p1","agent_id":"a1","limit":` + limit + `}`))
		e, ok := protocol.AsError(err)
		require.True(t, ok, "limit %s: %v", limit, err)
		require.Len(t, e.Violations, 1, "limit %s: %+v", limit, e.Violations)
		require.Equal(t, "body.limit", e.Violations[0].Field, "limit %s", limit)
		require.Equal(t, code, e.Violations[0].Code, "limit %s: %s", limit, e.Violations[0].Message)
	}
	for limit, want := range map[string]int{`null`: 0, `0`: 0, `1`: 1, `1000`: 1000} {
		req, err := parseInboxList([]byte(`{"project_id":"p1","agent_id":"a1","limit":` + limit + `}`))
		require.NoError(t, err, "limit %s", limit)
		require.Equal(t, want, req.Limit, "limit %s", limit)
	}
}
