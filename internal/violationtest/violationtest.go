// Package violationtest holds test assertions about the refusals that
// list every violation (protocol.Error), shared by the packages' tests.
package violationtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// ConfigFields returns the fields a config's Validate error names, in
// order, requiring a bad_request whose every violation is invalid_value.
func ConfigFields(t *testing.T, err error) []string {
	t.Helper()
	require.ErrorIs(t, err, protocol.ErrBadRequest)
	e, ok := protocol.AsError(err)
	require.True(t, ok, "not a *protocol.Error: %v", err)
	var fields []string
	for _, v := range e.Violations {
		require.Equal(t, protocol.VInvalidValue, v.Code, v.Field)
		fields = append(fields, v.Field)
	}
	return fields
}
