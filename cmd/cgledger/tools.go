package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"time"
)

func tools(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" || args[0] == "help" {
		out := stdout
		if len(args) == 0 {
			out = os.Stderr
		}
		fmt.Fprint(out, "Usage:\n  cgledger tools register FILE.yaml --project P   register or update a tool from YAML (or JSON)\n  cgledger tools list --project P                 list the project's tools (registered and built-in)\n")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	switch args[0] {
	case "register":
		return toolsRegister(args[1:])
	case "list":
		return toolsList(args[1:])
	}
	return failf(exitUsage, "tools: unknown subcommand %q (register, list)", args[0])
}

func toolsRegister(args []string) int {
	fs := newFlagSet("tools register", "tools register FILE.yaml --project P [--json]",
		`Register a tool definition (YAML or JSON, see docs/executor.md) in a project, through the
server's POST /projects/{project_id}/tools. Registering the same definition again changes
nothing; a changed one becomes a new version. Invalid definitions are refused with every violation.`)
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required)")
	pos, code, ok := parseOrExit(fs, args, 1)
	if !ok {
		return code
	}
	if *project == "" {
		return failf(exitUsage, "tools register: --project is required")
	}
	body, err := os.ReadFile(pos[0])
	if err != nil {
		return failf(exitUsage, "tools register: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var res struct {
		ToolName  string          `json:"tool_name"`
		Seq       uint64          `json:"seq"`
		Unchanged bool            `json:"unchanged"`
		Def       json.RawMessage `json:"definition"`
	}
	if err := cf.httpDo(ctx, "POST", "/projects/"+url.PathEscape(*project)+"/tools", nil, bytes.NewReader(body), &res); err != nil {
		return failf(exitFor(err), "tools register: %v", err)
	}
	if cf.asJSON {
		printJSON(res)
		return exitOK
	}
	state := "registered"
	if res.Unchanged {
		state = "unchanged"
	}
	fmt.Fprintf(stdout, "%s %s in project %s (ledger seq %d)\n", state, res.ToolName, *project, res.Seq)
	return exitOK
}

func toolsList(args []string) int {
	fs := newFlagSet("tools list", "tools list --project P [--json]", "List a project's tools: the registered ones (with the ledger sequence of the version in force) and the built-ins it did not override.")
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required)")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	if *project == "" {
		return failf(exitUsage, "tools list: --project is required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type tool struct {
		Seq        uint64 `json:"seq"`
		Builtin    bool   `json:"builtin"`
		Definition struct {
			ToolName       string `json:"tool_name"`
			Description    string `json:"description"`
			TargetSubject  string `json:"target_subject"`
			AfterExecution string `json:"after_execution"`
		} `json:"definition"`
	}
	var all []tool
	q := url.Values{}
	for {
		var raw json.RawMessage
		if err := cf.httpDo(ctx, "GET", "/projects/"+url.PathEscape(*project)+"/tools", q, nil, &raw); err != nil {
			return failf(exitFor(err), "tools list: %v", err)
		}
		if cf.asJSON {
			fmt.Fprintln(stdout, string(bytes.TrimSpace(raw)))
		}
		var page struct {
			Items      []tool `json:"items"`
			Tools      []tool `json:"tools"` // servers before items
			NextCursor string `json:"next_cursor"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return failf(exitFailed, "tools list: the server's answer does not decode: %v (--json prints it as received)", err)
		}
		if page.Items == nil {
			page.Items = page.Tools
		}
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			break
		}
		q.Set("cursor", page.NextCursor)
	}
	if cf.asJSON {
		return exitOK
	}
	res := struct{ Tools []tool }{all}
	for _, t := range res.Tools {
		origin := fmt.Sprintf("seq %d", t.Seq)
		if t.Builtin {
			origin = "built-in"
		}
		fmt.Fprintf(stdout, "%-20s %-9s %-10s %s  %s\n", t.Definition.ToolName, origin, t.Definition.AfterExecution, t.Definition.TargetSubject, t.Definition.Description)
	}
	return exitOK
}
