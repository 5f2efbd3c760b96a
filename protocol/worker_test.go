package protocol_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestWorkerParsersRefuseRawBodies: the bodies a data-driven case cannot
// hold (not UTF-8, over the size limit) are refused as a whole, under
// "body", by each parser of a worker's request.
func TestWorkerParsersRefuseRawBodies(t *testing.T) {
	parsers := map[string]func([]byte) protocol.Violations{
		protocol.OpRosterSet: func(b []byte) protocol.Violations { _, vs := protocol.ParseRosterEntry(b); return vs },
		protocol.OpConsume:   func(b []byte) protocol.Violations { _, vs := protocol.ParseConsumeRequest(b); return vs },
		protocol.OpCancel:    func(b []byte) protocol.Violations { _, vs := protocol.ParseCancelRequest(b); return vs },
		protocol.OpResume:    func(b []byte) protocol.Violations { _, vs := protocol.ParseResumeRequest(b); return vs },
	}
	big := strings.Repeat("é", (protocol.MaxRequestBytes+1)/2)
	for op, parse := range parsers {
		for body, code := range map[string]string{
			"{\"project_id\":\"\xff\xfe\"}": protocol.VInvalidUTF8,
			"{\"reason\":\"\xff\xfe\"}":     protocol.VInvalidUTF8,
			`{"project_id":"` + big + `"}`:  protocol.VTooLarge,
		} {
			vs := parse([]byte(body))
			require.Len(t, vs, 1, op)
			require.Equal(t, "body", vs[0].Field, op)
			require.Equal(t, code, vs[0].Code, op)
		}
	}
}
