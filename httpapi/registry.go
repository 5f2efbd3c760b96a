package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"sort"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/httpapi/problem"
	"github.com/cgledger/cgledger/protocol"
)

// Registry is what the tool registry's routes need from the ledger.
type Registry interface {
	RegisterToolYAML(ctx context.Context, project string, body []byte) (protocol.RegisterResult, error)
	GetTool(ctx context.Context, project, tool string) (*protocol.StoredTool, error)
	ListTools(ctx context.Context, project string) ([]protocol.StoredTool, error)
}

// ToolPauser is what the pause and resume endpoints need from the ledger:
// tool.pause and tool.resume with the request body as received
// (ledger.Ledger.ToolPauseOp).
type ToolPauser interface {
	ToolPauseOp(ctx context.Context, op, actor string, body []byte) (protocol.ToolPauseResult, error)
}

// RegistryConfig configures NewRegistry.
type RegistryConfig struct {
	// Actor names the admin making a request (the CG-Actor of its pause
	// or resume entry); nil, or an empty answer, means "admin".
	Actor func(*http.Request) string
}

// maxPauseBodyBytes bounds a pause or resume request body (the reason is
// at most protocol.MaxOperatorReasonBytes).
const maxPauseBodyBytes = 16 << 10

// maxDefinitionBytes bounds a registration request body.
const maxDefinitionBytes = 256 << 10

// RegistryRoutes are the patterns NewRegistry serves (its catch-all
// aside); the OpenAPI document's tests check each is documented.
func RegistryRoutes() []string {
	var out []string
	for _, rt := range registryRoutes(nil) {
		out = append(out, rt.pattern)
	}
	return out
}

type registryRoute struct {
	pattern string
	serve   http.HandlerFunc
}

// NewRegistry serves the tool registry management API:
// POST /projects/{project_id}/tools (YAML or JSON body), GET
// /projects/{project_id}/tools (paged: limit, cursor) and GET
// /projects/{project_id}/tools/{tool_name}. builtins are listed for
// projects that did not register their own. Errors are RFC 9457 problem
// details; a request no route serves is 404, or 405 with
// Allow.
//
// When r is a ToolPauser it also serves POST /projects/{project_id}/tools/{tool_name}/pause and
// /resume (body ToolPauseBody; an admin's, by the HTTP policy).
func NewRegistry(r Registry, cfg RegistryConfig, builtins ...*protocol.ToolDefinition) http.Handler {
	mux := http.NewServeMux()
	for _, rt := range registryRoutes(&registry{r: r, builtins: builtins, cfg: cfg}) {
		mux.HandleFunc(rt.pattern, rt.serve)
	}
	mux.HandleFunc("/projects/", Fallback(mux, "/projects/"))
	return mux
}

type registry struct {
	r        Registry
	builtins []*protocol.ToolDefinition
	cfg      RegistryConfig
}

func registryRoutes(g *registry) []registryRoute {
	return []registryRoute{
		{"POST /projects/{project}/tools", g.register},
		{"GET /projects/{project}/tools", g.list},
		{"GET /projects/{project}/tools/{tool}", g.get},
		{"POST /projects/{project}/tools/{tool}/pause", g.pauseOp(protocol.OpToolPause)},
		{"POST /projects/{project}/tools/{tool}/resume", g.pauseOp(protocol.OpToolResume)},
	}
}

// pauseOp serves POST .../pause or .../resume: the body's reason, with the
// path's project and tool, is the op's request; the ledger's refusal (every
// violation, its rejection_seq) is the problem answered.
func (g *registry) pauseOp(op string) http.HandlerFunc {
	if g == nil {
		return nil
	}
	return func(w http.ResponseWriter, req *http.Request) {
		pauser, ok := g.r.(ToolPauser)
		if !ok {
			Error(w, &protocol.Error{Code: protocol.CodeNotFound, Message: "this server does not pause tools"})
			return
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, maxPauseBodyBytes+1))
		if err != nil {
			Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "cannot read body: " + err.Error()})
			return
		}
		project, tool := req.PathValue("project"), req.PathValue("tool")
		var vs protocol.Violations
		var members map[string]json.RawMessage
		switch {
		case len(body) > maxPauseBodyBytes:
			vs.Add("body", protocol.VTooLarge, "is more than %d bytes", maxPauseBodyBytes)
		case json.Unmarshal(body, &members) != nil || members == nil:
			vs.Add("body", protocol.VInvalidType, `must be a JSON object {"reason": "..."}`)
		}
		for name, want := range map[string]string{"project_id": project, "tool_name": tool} {
			var got string
			if raw, ok := members[name]; ok && (json.Unmarshal(raw, &got) != nil || got != want) {
				vs.Add("body."+name, protocol.VMismatch, "the path names %q; leave %s out of the body", want, name)
			}
		}
		var full []byte
		if members != nil {
			members["project_id"], _ = json.Marshal(project)
			members["tool_name"], _ = json.Marshal(tool)
			if full, err = json.Marshal(members); err != nil {
				Error(w, err)
				return
			}
		}
		if len(vs) > 0 {
			// Refused here, before the ledger: still list every violation,
			// the request's own (an empty reason, a member it does not
			// take) beside the path's.
			if full != nil {
				_, rvs := protocol.ParseToolPauseRequest(full)
				vs = append(vs, rvs...)
			}
			Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid " + op + " request", Violations: vs})
			return
		}
		actor := ""
		if g.cfg.Actor != nil {
			actor = g.cfg.Actor(req)
		}
		if actor == "" {
			actor = "admin"
		}
		res, err := pauser.ToolPauseOp(req.Context(), op, actor, full)
		if err != nil {
			pauseError(w, err)
			return
		}
		Write(w, http.StatusOK, res)
	}
}

func (g *registry) register(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxDefinitionBytes+1))
	if err != nil {
		Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "cannot read body: " + err.Error()})
		return
	}
	if len(body) > maxDefinitionBytes {
		var vs protocol.Violations
		vs.Add("body", protocol.VTooLarge, "a tool definition is at most %d bytes", maxDefinitionBytes)
		Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "definition too large", Violations: vs})
		return
	}
	res, err := g.r.RegisterToolYAML(req.Context(), req.PathValue("project"), body)
	if err != nil {
		Error(w, err)
		return
	}
	status := http.StatusCreated
	if res.Unchanged {
		status = http.StatusOK
	}
	Write(w, status, res)
}

// registryCursor names the last tool of a page: whether it is a built-in,
// and its name.
func registryCursor(t executor.RegistryTool) string {
	flag := byte('r')
	if t.Builtin {
		flag = 'b'
	}
	return base64.RawURLEncoding.EncodeToString(append([]byte{flag}, t.Definition.ToolName...))
}

func (g *registry) list(w http.ResponseWriter, req *http.Request) {
	var vs protocol.Violations
	limit := Limit(req, &vs)
	cursor := req.URL.Query().Get("cursor")
	var after []byte
	if cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(cursor)
		if err != nil || len(b) < 2 || b[0] != 'r' && b[0] != 'b' {
			vs.Add("cursor", protocol.VInvalidValue, "is not a cursor of this query")
		}
		after = b
	}
	if len(vs) > 0 {
		Error(w, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid query parameters", Violations: vs})
		return
	}
	project := req.PathValue("project")
	tools, err := g.r.ListTools(req.Context(), project)
	if err != nil {
		Error(w, err)
		return
	}
	// Registered tools by name, then the built-ins not overridden, by name.
	all := []executor.RegistryTool{}
	seen := map[string]bool{}
	for _, t := range tools {
		seen[t.Definition.ToolName] = true
		all = append(all, executor.RegistryTool{StoredTool: t})
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].Definition.ToolName < all[j].Definition.ToolName })
	var bs []executor.RegistryTool
	for _, b := range g.builtins {
		if !seen[b.ToolName] {
			d := *b
			d.ProjectID = project
			bs = append(bs, executor.RegistryTool{StoredTool: protocol.StoredTool{Definition: d}, Builtin: true})
		}
	}
	sort.SliceStable(bs, func(i, j int) bool { return bs[i].Definition.ToolName < bs[j].Definition.ToolName })
	all = append(all, bs...)
	start := 0
	if after != nil {
		builtin, name := after[0] == 'b', string(after[1:])
		for start < len(all) && !registryAfter(all[start], builtin, name) {
			start++
		}
	}
	page := all[start:]
	out := executor.RegistryPage{ProjectID: project}
	if len(page) > limit {
		page = page[:limit]
		out.NextCursor = registryCursor(page[len(page)-1])
	}
	out.Items, out.Tools = page, page
	Write(w, http.StatusOK, out)
}

// registryAfter reports whether t comes after the tool a cursor names in
// the listing's order (registered tools, then built-ins; each by name).
func registryAfter(t executor.RegistryTool, builtin bool, name string) bool {
	if t.Builtin != builtin {
		return t.Builtin
	}
	return t.Definition.ToolName > name
}

func (g *registry) get(w http.ResponseWriter, req *http.Request) {
	project, name := req.PathValue("project"), req.PathValue("tool")
	t, err := g.r.GetTool(req.Context(), project, name)
	if err != nil {
		if isNotFound(err) {
			for _, b := range g.builtins {
				if b.ToolName == name {
					d := *b
					d.ProjectID = project
					Write(w, http.StatusOK, executor.RegistryTool{StoredTool: protocol.StoredTool{Definition: d}, Builtin: true})
					return
				}
			}
		}
		Error(w, err)
		return
	}
	Write(w, http.StatusOK, executor.RegistryTool{StoredTool: *t})
}

func isNotFound(err error) bool {
	e, ok := protocol.AsError(err)
	return ok && e.Code == protocol.CodeNotFound
}

// pauseError answers a refused pause or resume: its problem details, a
// conflict (paused already, running already) with status 409.
func pauseError(w http.ResponseWriter, err error) {
	d := Problem(err)
	if protocol.Code(d.Code) == protocol.CodeConflict {
		d = problem.New(http.StatusConflict, d.Code, d.Detail, d.Violations).WithRejection(d.RejectionSeq)
	}
	problem.Write(w, d)
}
