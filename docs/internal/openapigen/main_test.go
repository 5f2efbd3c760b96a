package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocumentIsCurrent fails when the committed docs/openapi.json is not
// what the generator writes.
func TestDocumentIsCurrent(t *testing.T) {
	onDisk, err := os.ReadFile(filepath.Join("..", "..", "openapi.json"))
	require.NoError(t, err)
	require.Equal(t, string(encodeDocument(buildDocument())), string(onDisk),
		"docs/openapi.json is stale: go generate ./docs (never edit it by hand)")
}
