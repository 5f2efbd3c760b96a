package httpclient

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/protocol"
)

// Tools lists a project's tools as the registry answers them: registered
// ones by name, then the built-ins it did not override
// (GET /projects/{project}/tools). Only l's Limit and Cursor apply.
func (c *Client) Tools(ctx context.Context, project string, l List) (executor.RegistryPage, error) {
	return get[executor.RegistryPage](ctx, c, path("projects", project, "tools"), listQuery(List{Limit: l.Limit, Cursor: l.Cursor}))
}

// Tool is a tool's definition in force, or the built-in of that name
// (GET /projects/{project}/tools/{tool}).
func (c *Client) Tool(ctx context.Context, project, tool string) (executor.RegistryTool, error) {
	return get[executor.RegistryTool](ctx, c, path("projects", project, "tools", tool), nil)
}

// RegisterTool registers (or changes) a tool definition from its YAML or
// JSON text (POST /projects/{project}/tools); Unchanged says the same
// definition was in force already.
func (c *Client) RegisterTool(ctx context.Context, project string, definition []byte) (protocol.RegisterResult, error) {
	return post[protocol.RegisterResult](ctx, c, path("projects", project, "tools"), rawBody{data: definition})
}

// PauseTool holds every new dispatch of a tool until ResumeTool
// (POST /projects/{project}/tools/{tool}/pause).
func (c *Client) PauseTool(ctx context.Context, project, tool, reason string) (protocol.ToolPauseResult, error) {
	return post[protocol.ToolPauseResult](ctx, c, path("projects", project, "tools", tool, "pause"), executor.ToolPauseBody{Reason: reason})
}

// ResumeTool publishes the commands of the calls held by a pause
// (POST /projects/{project}/tools/{tool}/resume).
func (c *Client) ResumeTool(ctx context.Context, project, tool, reason string) (protocol.ToolPauseResult, error) {
	return post[protocol.ToolPauseResult](ctx, c, path("projects", project, "tools", tool, "resume"), executor.ToolPauseBody{Reason: reason})
}

// Export streams the ledger from fromSeq on (0 means 1) as an export file,
// one JSON entry per line (GET /v1/export). The caller reads and closes
// it; a failure mid-stream ends it with an error, an answer that does not
// start is a *Problem.
func (c *Client) Export(ctx context.Context, fromSeq uint64) (io.ReadCloser, error) {
	if fromSeq == 0 {
		fromSeq = 1
	}
	q := map[string][]string{"from_seq": {strconv.FormatUint(fromSeq, 10)}}
	resp, err := c.send(ctx, http.MethodGet, "/v1/export", q, nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Health is the answer of GET /healthz: "ok", or why not.
type Health struct {
	Status string `json:"status"`
}

// Readiness is the answer of GET /readyz.
type Readiness struct {
	// Status is "ready" or "not ready"; Reason says why not.
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	// Roles are the roles the process runs (api, executor, projector).
	Roles []string `json:"roles"`
	// AppliedSeq is the projector's applied sequence; LastSeq the ledger
	// stream's last (0 when the server could not read it in time).
	AppliedSeq uint64 `json:"applied_seq,omitempty"`
	LastSeq    uint64 `json:"last_seq,omitempty"`
}

// Health asks whether the process is alive and connected (GET /healthz).
// A 503 answer is not an error: Status says what is wrong.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.probe(ctx, "/healthz", &h)
	return h, err
}

// Ready asks whether the process is ready (GET /readyz). A 503 answer is
// not an error: Status and Reason say why not.
func (c *Client) Ready(ctx context.Context) (Readiness, error) {
	var r Readiness
	err := c.probe(ctx, "/readyz", &r)
	return r, err
}

// probe GETs a health route, decoding its body on 200 and 503 alike.
func (c *Client) probe(ctx context.Context, p string, out any) error {
	resp, err := c.send(ctx, http.MethodGet, p, nil, nil)
	if err != nil {
		var pr *Problem
		if errors.As(err, &pr) && pr.Status == http.StatusServiceUnavailable && pr.Code == "" {
			if jerr := json.Unmarshal(pr.Body, out); jerr == nil {
				return nil
			}
		}
		return err
	}
	defer resp.Body.Close()
	return c.decode(resp, http.MethodGet, out)
}
