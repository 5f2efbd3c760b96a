package mcpbridge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/protocol"
)

// TestConfigListsEveryViolation: a bad configuration is refused with every
// problem, by field; a good one gets its defaults.
func TestConfigListsEveryViolation(t *testing.T) {
	fields := configViolations(t, `project: "bad project"
servers:
  - name: a
    command: [x]
    url: ftp://nope
  - name: b
    target: sleep
    restart_min_ms: 5000
    restart_max_ms: 1000
    auth_env: KEY
    tools: {t: {determinism: sometimes}}
  - name: c
    target: mcp_a
    url: http://x
`)
	require.Equal(t, map[string]string{
		"project":                        protocol.VInvalidToken,
		"servers[0].url":                 protocol.VInvalidValue,
		"servers[1].target":              protocol.VReserved,
		"servers[1].command":             protocol.VRequired,
		"servers[1].auth_env":            protocol.VInvalidValue,
		"servers[1].restart_max_ms":      protocol.VInvalidValue,
		"servers[1].tools.t.determinism": protocol.VInvalidValue,
		"servers[2].target":              protocol.VInvalidValue,
	}, fields)

	_, err := LoadConfig(writeConfig(t, "project: p\nservers: [{name: a, command: [x], colour: red}]\n"))
	require.ErrorContains(t, err, "colour")

	c, err := LoadConfig(writeConfig(t, "project: p\nservers: [{name: a, command: [x]}]\n"))
	require.NoError(t, err)
	s := c.Servers[0]
	require.Equal(t, "mcp_a", s.Target)
	require.Equal(t, "a_", *s.Prefix)
	require.EqualValues(t, DefaultConnectTimeoutMS, s.ConnectTimeoutMS)
	require.Equal(t, DefaultMaxInlineBytes, s.MaxInlineBytes)
	require.Equal(t, "Authorization", s.AuthHeader)
}

// TestDeterminismFromAnnotations: readOnlyHint -> pure, else
// idempotentHint -> idempotent, else side_effectful (MCP's defaults).
func TestDeterminismFromAnnotations(t *testing.T) {
	f := false
	require.Equal(t, protocol.DeterminismSideEffectful, Determinism(nil))
	require.Equal(t, protocol.DeterminismPure, Determinism(&mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}))
	require.Equal(t, protocol.DeterminismIdempotent, Determinism(&mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: &f}))
	require.Equal(t, protocol.DeterminismSideEffectful, Determinism(&mcp.ToolAnnotations{DestructiveHint: &f}))
}

// TestBinaryContentIsAReference: image, audio and blob bytes are kept as
// size and SHA-256, with the bytes only up to max_inline_bytes.
func TestBinaryContentIsAReference(t *testing.T) {
	img := &mcp.ImageContent{Data: []byte("0123456789"), MIMEType: "image/png"}
	m, err := contentMap(img, 4)
	require.NoError(t, err)
	require.NotContains(t, m, "data")
	ref := m["data_ref"].(Ref)
	require.Equal(t, 10, ref.Size)
	require.Equal(t, "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882", ref.SHA256)
	require.True(t, ref.Omitted)
	require.Empty(t, ref.Data)

	m, err = contentMap(&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///x", MIMEType: "application/octet-stream", Blob: []byte("ab")}}, 64)
	require.NoError(t, err)
	res := m["resource"].(map[string]any)
	require.NotContains(t, res, "blob")
	require.Equal(t, "YWI=", res["blob_ref"].(Ref).Data)
	require.Equal(t, "file:///x", res["uri"])

	m, err = contentMap(&mcp.AudioContent{Data: []byte("abc"), MIMEType: "audio/wav"}, -1)
	require.NoError(t, err)
	require.True(t, m["data_ref"].(Ref).Omitted)
}

// TestConfigDocsExample: the configuration of docs/mcp.md parses as
// written, with the JSON names `tools list --json` shows (limits'
// timeout_ms_default and timeout_ms_max).
func TestConfigDocsExample(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "mcp.md"))
	require.NoError(t, err)
	s := string(doc)
	start := strings.Index(s, "### Configuration\n\n```yaml\n")
	require.NotEqual(t, -1, start)
	s = s[start+len("### Configuration\n\n```yaml\n"):]
	s = s[:strings.Index(s, "```")]
	c, err := LoadConfig(writeConfig(t, s))
	require.NoError(t, err)
	require.EqualValues(t, 30000, c.Servers[0].Limits.TimeoutMSDefault)
	require.EqualValues(t, 300000, c.Servers[0].Limits.TimeoutMSMax)
	require.Equal(t, protocol.DeterminismIdempotent, c.Servers[0].Tools["trigger-long-running-operation"].Determinism)
	require.Equal(t, "REMOTE_MCP_TOKEN", c.Servers[1].AuthEnv)
}

// TestConfigUnknownFieldsBesideTheRest: unknown fields (at any depth, Go's
// lower-cased names included) and values of the wrong type are violations
// listed with every other problem of the file, not instead of them.
func TestConfigUnknownFieldsBesideTheRest(t *testing.T) {
	fields := configViolations(t, `project: p
colour: red
servers:
  - name: "bad name"
    command: [x]
    url: http://x
    target: echo
    limits: {timeoutmsdefault: 5}
    tools: {t: {skip: true, why: no}}
  - name: b
    url: http://y
    restart_min_ms: soon
    name: b2
`)
	require.Equal(t, map[string]string{
		"colour":                             protocol.VInvalidValue,
		"servers[0].name":                    protocol.VInvalidToken,
		"servers[0].url":                     protocol.VInvalidValue,
		"servers[0].target":                  protocol.VReserved,
		"servers[0].limits.timeoutmsdefault": protocol.VInvalidValue,
		"servers[0].tools.t.why":             protocol.VInvalidValue,
		"servers[1].restart_min_ms":          protocol.VInvalidType,
		"servers[1].name":                    protocol.VDuplicate,
	}, fields)
}

// writeConfig writes a bridge configuration file and returns its path.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
	return path
}

// configViolations loads a configuration that must be refused with a
// protocol error and returns its violations' codes by field.
func configViolations(t *testing.T, yaml string) map[string]string {
	t.Helper()
	_, err := LoadConfig(writeConfig(t, yaml))
	e, ok := protocol.AsError(err)
	require.True(t, ok, "%v", err)
	fields := map[string]string{}
	for _, v := range e.Violations {
		fields[v.Field] = v.Code
	}
	return fields
}
