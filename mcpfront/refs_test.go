package mcpfront

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// TestContentOfBridgeRefs: a bridge's result card keeps binary content as
// references; the answer gives back the bytes kept inline, and names the
// ones that were not.
func TestContentOfBridgeRefs(t *testing.T) {
	raw := json.RawMessage(`{"mcp_server":"s","mcp_tool":"t","content":[
{"type":"text","text":"hi"},
{"type":"image","mimeType":"image/png","data_ref":{"size":3,"sha256":"ab","data":"AQID"}},
{"type":"audio","mimeType":"audio/wav","data_ref":{"size":9000000,"sha256":"cd","omitted":true}},
{"type":"resource","resource":{"uri":"x://b","mimeType":"application/octet-stream","blob_ref":{"size":3,"sha256":"ef","data":"BAUG"}}}]}`)
	res, err := contentOf(raw)
	require.NoError(t, err)
	require.Len(t, res.Content, 4)
	require.Equal(t, "hi", res.Content[0].(*mcp.TextContent).Text)
	img := res.Content[1].(*mcp.ImageContent)
	require.Equal(t, []byte{1, 2, 3}, img.Data)
	require.Equal(t, "image/png", img.MIMEType)
	require.Contains(t, res.Content[2].(*mcp.TextContent).Text, "audio audio/wav of 9000000 bytes, sha256 cd")
	blob := res.Content[3].(*mcp.EmbeddedResource).Resource
	require.Equal(t, []byte{4, 5, 6}, blob.Blob)

	plain := json.RawMessage(`{"content":[{"type":"text","text":"x"}]}`)
	require.Equal(t, string(plain), string(inlineResult(plain)), "no references: unchanged")
}
