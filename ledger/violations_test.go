// Violation assertions shared by the ledger tests that check a refusal is
// recorded (the pure validation tests live in protocol).
package ledger_test

import (
	"errors"
	"fmt"
	"sort"
	"testing"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// vtViol is a violation's field and code, the stable part tests assert on.
type vtViol struct{ Field, Code string }

func (v vtViol) String() string { return v.Field + "/" + v.Code }

func vtSorted(vs []vtViol) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.String()
	}
	sort.Strings(out)
	return out
}

// vtRequireViolations asserts that vs holds exactly want (field and code,
// any order, with multiplicity) and that every violation has a message.
func vtRequireViolations(t *testing.T, vs []protocol.Violation, want ...vtViol) {
	t.Helper()
	got := make([]vtViol, len(vs))
	for i, v := range vs {
		got[i] = vtViol{v.Field, v.Code}
		assert.NotEmpty(t, v.Message, "violation %+v has no message", v)
	}
	require.Equal(t, vtSorted(want), vtSorted(got), "violations: %+v", vs)
}

// vtRequireBadRequest asserts err is a bad_request *protocol.Error holding
// exactly want.
func vtRequireBadRequest(t *testing.T, err error, want ...vtViol) {
	t.Helper()
	require.Error(t, err)
	var e *protocol.Error
	require.True(t, errors.As(err, &e), "error %v (%T) is not a *protocol.Error", err, err)
	require.Equal(t, protocol.CodeBadRequest, e.Code, "error: %v", err)
	require.True(t, errors.Is(err, protocol.ErrBadRequest))
	assert.Contains(t, e.Message, fmt.Sprintf("%d violation(s)", len(want)))
	vtRequireViolations(t, e.Violations, want...)
}

// vtTrace is a valid traceparent.
const vtTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// vtWith copies h with the name/value pairs kv set.
func vtWith(h nats.Header, kv ...string) nats.Header {
	out := nats.Header{}
	for k, v := range h {
		out[k] = append([]string(nil), v...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = []string{kv[i+1]}
	}
	return out
}
