package executor

import (
	"context"
	"io"
	"net/http"

	"github.com/cgledger/cgledger/internal/httpjson"
	"github.com/cgledger/cgledger/ledger"
)

// Registry is what the management API needs from the ledger.
type Registry interface {
	RegisterToolYAML(ctx context.Context, project string, body []byte) (ledger.RegisterResult, error)
	GetTool(ctx context.Context, project, tool string) (*ledger.StoredTool, error)
	ListTools(ctx context.Context, project string) ([]ledger.StoredTool, error)
}

// maxDefinitionBytes bounds a registration request body.
const maxDefinitionBytes = 256 << 10

// RegistryHandler serves the tool registry management API:
// POST /projects/{project_id}/tools (YAML or JSON body), GET
// /projects/{project_id}/tools and GET /projects/{project_id}/tools/{tool_name}.
// builtins are listed for projects that did not register their own.
func RegistryHandler(r Registry, builtins ...*ledger.ToolDefinition) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /projects/{project}/tools", func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(io.LimitReader(req.Body, maxDefinitionBytes+1))
		if err != nil {
			httpjson.Error(w, &ledger.Error{Code: ledger.CodeBadRequest, Message: "cannot read body: " + err.Error()})
			return
		}
		if len(body) > maxDefinitionBytes {
			var vs ledger.Violations
			vs.Add("body", ledger.VTooLarge, "a tool definition is at most %d bytes", maxDefinitionBytes)
			httpjson.Error(w, &ledger.Error{Code: ledger.CodeBadRequest, Message: "definition too large", Violations: vs})
			return
		}
		res, err := r.RegisterToolYAML(req.Context(), req.PathValue("project"), body)
		if err != nil {
			httpjson.Error(w, err)
			return
		}
		status := http.StatusCreated
		if res.Unchanged {
			status = http.StatusOK
		}
		httpjson.Write(w, status, res)
	})
	mux.HandleFunc("GET /projects/{project}/tools", func(w http.ResponseWriter, req *http.Request) {
		project := req.PathValue("project")
		tools, err := r.ListTools(req.Context(), project)
		if err != nil {
			httpjson.Error(w, err)
			return
		}
		type item struct {
			ledger.StoredTool
			Builtin bool `json:"builtin"`
		}
		out := []item{}
		seen := map[string]bool{}
		for _, t := range tools {
			seen[t.Definition.ToolName] = true
			out = append(out, item{StoredTool: t})
		}
		for _, b := range builtins {
			if !seen[b.ToolName] {
				d := *b
				d.ProjectID = project
				out = append(out, item{StoredTool: ledger.StoredTool{Definition: d}, Builtin: true})
			}
		}
		httpjson.Write(w, http.StatusOK, map[string]any{"project_id": project, "tools": out})
	})
	mux.HandleFunc("GET /projects/{project}/tools/{tool}", func(w http.ResponseWriter, req *http.Request) {
		project, name := req.PathValue("project"), req.PathValue("tool")
		t, err := r.GetTool(req.Context(), project, name)
		if err != nil {
			if isNotFound(err) {
				for _, b := range builtins {
					if b.ToolName == name {
						d := *b
						d.ProjectID = project
						httpjson.Write(w, http.StatusOK, map[string]any{"seq": 0, "definition": d, "builtin": true})
						return
					}
				}
			}
			httpjson.Error(w, err)
			return
		}
		httpjson.Write(w, http.StatusOK, t)
	})
	return mux
}

func isNotFound(err error) bool {
	e, ok := ledger.AsError(err)
	return ok && e.Code == ledger.CodeNotFound
}
