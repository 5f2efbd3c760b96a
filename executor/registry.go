package executor

import "github.com/cgledger/cgledger/protocol"

// The tool registry's HTTP answers and request bodies (httpapi serves
// them; the HTTP client reads them).

// ToolPauseBody is the body of POST /projects/{project}/tools/{tool}/pause
// and /resume: the operator's reason (project and tool are the path's).
type ToolPauseBody struct {
	Reason string `json:"reason"`
}

// RegistryTool is a tool as the registry answers it: the definition in
// force and the entry that wrote it, or a built-in (Seq 0, Builtin true)
// the project did not override.
type RegistryTool struct {
	protocol.StoredTool
	Builtin bool `json:"builtin"`
}

// RegistryPage is one page of GET /projects/{project_id}/tools: the
// registered tools by name, then the built-ins the project did not
// override, by name. NextCursor continues it (absent on the last page).
type RegistryPage struct {
	ProjectID  string         `json:"project_id"`
	Items      []RegistryTool `json:"items"`
	NextCursor string         `json:"next_cursor,omitempty"`
	// Tools repeats Items. Deprecated: read items; tools goes away in a
	// later release.
	Tools []RegistryTool `json:"tools"`
}
