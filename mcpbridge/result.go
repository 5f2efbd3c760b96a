package mcpbridge

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cgledger/cgledger/executor"
)

// Taxonomy codes of the bridge's outcomes.
const (
	// CodeToolError: the MCP tool answered isError; the message is its text.
	CodeToolError = "S-TOOL-MCP-ERROR"
	// CodeInvalidParams: the MCP server refused the arguments (-32602).
	CodeInvalidParams = "I-REQ-MCP-PARAMS"
	// CodeProtocolError: the MCP server answered the call with another
	// JSON-RPC error.
	CodeProtocolError = "S-TOOL-MCP-PROTOCOL"
)

// Result is a successful call's output, the result card's result: the MCP
// content kept whole and typed (binary data as references, see Ref).
type Result struct {
	Server            string              `json:"mcp_server"`
	Tool              string              `json:"mcp_tool"`
	Content           []map[string]any    `json:"content"`
	StructuredContent any                 `json:"structuredContent,omitempty"`
	Meta              map[string]any      `json:"_meta,omitempty"`
	Progress          []executor.Progress `json:"progress,omitempty"`
}

// outcome maps a tools/call result: isError is a failure whose message is
// the content's text; anything else a success with the content.
func outcome(res *mcp.CallToolResult, server, tool string, progress []executor.Progress, maxInline int) executor.Outcome {
	content := make([]map[string]any, 0, len(res.Content))
	var texts []string
	for _, c := range res.Content {
		m, err := contentMap(c, maxInline)
		if err != nil {
			return executor.Terminal(CodeProtocolError, fmt.Sprintf("MCP server %s: content of tool %s cannot be encoded: %v", server, tool, err), "report it to the MCP server's owner")
		}
		if t, ok := c.(*mcp.TextContent); ok {
			texts = append(texts, t.Text)
		}
		content = append(content, m)
	}
	if res.IsError {
		msg := strings.Join(texts, "\n")
		if msg == "" {
			msg = fmt.Sprintf("MCP tool %s reported an error without text", tool)
		}
		return executor.Terminal(CodeToolError, msg, "the MCP tool refused the call: read the message, change the arguments")
	}
	return executor.Success(Result{Server: server, Tool: tool, Content: content, StructuredContent: res.StructuredContent, Meta: res.Meta, Progress: progress})
}

// contentMap is one content item as MCP writes it, with binary data
// (image and audio data, a resource's blob) replaced by a reference.
func contentMap(c mcp.Content, maxInline int) (map[string]any, error) {
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	switch v := c.(type) {
	case *mcp.ImageContent:
		delete(m, "data")
		m["data_ref"] = ref(v.Data, maxInline)
	case *mcp.AudioContent:
		delete(m, "data")
		m["data_ref"] = ref(v.Data, maxInline)
	case *mcp.EmbeddedResource:
		if v.Resource != nil && v.Resource.Blob != nil {
			if r, ok := m["resource"].(map[string]any); ok {
				delete(r, "blob")
				r["blob_ref"] = ref(v.Resource.Blob, maxInline)
			}
		}
	}
	return m, nil
}

// Ref stands for binary content in a result card: its size and SHA-256 (of
// the decoded bytes), and the bytes themselves (base64) only when they fit
// max_inline_bytes.
type Ref struct {
	Size   int    `json:"size"`
	SHA256 string `json:"sha256"`
	// Data is the base64 of the bytes, absent when Omitted.
	Data    string `json:"data,omitempty"`
	Omitted bool   `json:"omitted,omitempty"`
}

func ref(b []byte, maxInline int) Ref {
	sum := sha256.Sum256(b)
	r := Ref{Size: len(b), SHA256: hex.EncodeToString(sum[:])}
	if maxInline >= 0 && len(b) <= maxInline {
		r.Data = base64.StdEncoding.EncodeToString(b)
	} else {
		r.Omitted = true
	}
	return r
}

// wireOutcome maps a JSON-RPC error answering tools/call.
func wireOutcome(server string, e *jsonrpc.Error) executor.Outcome {
	msg := fmt.Sprintf("MCP server %s: %s (JSON-RPC %d)", server, e.Message, e.Code)
	switch e.Code {
	case jsonrpc.CodeInvalidParams:
		return executor.Terminal(CodeInvalidParams, msg, "fix the arguments: the MCP server refused them")
	case jsonrpc.CodeMethodNotFound:
		return executor.Terminal(executor.CodeUnknownTool, msg, "the MCP server does not serve this tool")
	}
	return executor.Terminal(CodeProtocolError, msg, "report it to the MCP server's owner")
}
