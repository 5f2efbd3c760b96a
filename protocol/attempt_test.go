package protocol_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestIdempotencyKeyIsTheDocumentedHash: the key is what docs/protocol.md
// tells services in other languages to compute, the same for one call every
// time, and different for ids that only split the same text differently.
func TestIdempotencyKeyIsTheDocumentedHash(t *testing.T) {
	sum := sha256.Sum256([]byte("4:proj;6:turn-1;6:call-1;"))
	want := "idem-" + hex.EncodeToString(sum[:16])
	require.Equal(t, want, protocol.IdempotencyKey("proj", "turn-1", "call-1"))
	require.Equal(t, want, protocol.IdempotencyKey("proj", "turn-1", "call-1"))
	require.NotEqual(t, protocol.IdempotencyKey("proj", "turn-1", "call-2"), want)
	require.NotEqual(t, protocol.IdempotencyKey("ab", "c", "d"), protocol.IdempotencyKey("a", "bc", "d"))
}
