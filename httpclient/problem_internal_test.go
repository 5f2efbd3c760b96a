package httpclient

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestProblemFrom reads the three shapes of an error answer: a problem
// with the legacy error member (which wins), a problem without it, and a
// body that is not a problem at all.
func TestProblemFrom(t *testing.T) {
	p := problemFrom("GET", "http://x/v1/digest", 409, []byte(`{"type":"t","title":"Conflict","detail":"new","code":"conflict","error":{"code":"mismatch","message":"old","violations":[{"field":"f","code":"c","message":"m"}],"rejection_seq":7}}`))
	require.Equal(t, protocol.Code("mismatch"), p.Code)
	require.Equal(t, "old", p.Detail)
	require.Equal(t, uint64(7), p.RejectionSeq)
	require.Len(t, p.Violations, 1)
	require.Equal(t, "Conflict", p.Title)

	p = problemFrom("GET", "http://x/v1/digest", 400, []byte(`{"type":"t","title":"Bad request","detail":"d","code":"bad_request","violations":[{"field":"a","code":"b","message":"c"}],"rejection_seq":3}`))
	require.Equal(t, protocol.CodeBadRequest, p.Code)
	require.Equal(t, "d", p.Detail)
	require.Equal(t, uint64(3), p.RejectionSeq)
	require.ErrorIs(t, p, protocol.ErrBadRequest)

	p = problemFrom("GET", "http://x/v1/digest", 502, []byte("bad gateway\n"))
	require.Empty(t, p.Code)
	require.Nil(t, p.Unwrap())
	require.Equal(t, "GET http://x/v1/digest: HTTP 502: bad gateway", p.Error())
}
