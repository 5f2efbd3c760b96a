package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/httpclient"
)

// toolsUsage lists the tools verbs.
const toolsUsage = "Usage:\n  cgledger tools register FILE.yaml --project P   register or update a tool from YAML (or JSON)\n  cgledger tools list --project P                 list the project's tools (registered and built-in)\n  cgledger tools pause --project P --tool T --reason R    hold the tool's new calls until resumed (admin)\n  cgledger tools resume --project P --tool T --reason R   publish the held calls in dispatch order (admin)\n"

// tools runs the tools verbs (docs/cli.md).
func tools(args []string) int {
	if code, done := groupHelp(args, toolsUsage); done {
		return code
	}
	switch args[0] {
	case "register":
		return toolsRegister(args[1:])
	case "list":
		return toolsList(args[1:])
	case "pause", "resume":
		return toolsPause(args[0], args[1:])
	}
	return failf(exitUsage, "tools: unknown subcommand %q (register, list, pause, resume)", args[0])
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
	api, err := cf.api()
	if err != nil {
		return failf(exitFor(err), "tools register: %v", err)
	}
	reg, err := api.RegisterTool(ctx, *project, body)
	if err != nil {
		err = cf.httpErr(err)
		return failf(exitFor(err), "tools register: %v", err)
	}
	if cf.asJSON {
		// These four, indented, the definition as the server sent it.
		var res struct {
			ToolName  string          `json:"tool_name"`
			Seq       uint64          `json:"seq"`
			Unchanged bool            `json:"unchanged"`
			Def       json.RawMessage `json:"definition"`
		}
		if err := json.Unmarshal(cf.answer, &res); err != nil {
			return failf(exitFailed, "tools register: %v", err)
		}
		printJSON(res)
		return exitOK
	}
	state := "registered"
	if reg.Unchanged {
		state = "unchanged"
	}
	fmt.Fprintf(stdout, "%s %s in project %s (ledger seq %d)\n", state, reg.ToolName, *project, reg.Seq)
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
	api, err := cf.api()
	if err != nil {
		return failf(exitFor(err), "tools list: %v", err)
	}
	var all []executor.RegistryTool
	var l httpclient.List
	for {
		page, err := api.Tools(ctx, *project, l)
		if err != nil {
			err = cf.httpErr(err)
			return failf(exitFor(err), "tools list: %v", err)
		}
		if cf.asJSON {
			fmt.Fprintln(stdout, string(bytes.TrimSpace(cf.answer)))
		}
		if page.Items == nil {
			// Servers before items sent tools only.
			page.Items = page.Tools
		}
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			break
		}
		l.Cursor = page.NextCursor
	}
	if cf.asJSON {
		return exitOK
	}
	for _, t := range all {
		origin := fmt.Sprintf("seq %d", t.Seq)
		if t.Builtin {
			origin = "built-in"
		}
		fmt.Fprintf(stdout, "%-20s %-9s %-10s %s  %s\n", t.Definition.ToolName, origin, t.Definition.AfterExecution, t.Definition.TargetSubject, t.Definition.Description)
	}
	return exitOK
}

func toolsPause(verb string, args []string) int {
	help := `Pause a tool: from now on every dispatch of it is held (no command is published; its deadline,
fixed at dispatch, keeps running) until a resume. Commands published before the pause are not held:
they were delivered or wait in the tool's consumer. Through the server's
POST /projects/{project_id}/tools/{tool_name}/pause; an admin credential. Pausing a paused tool, or an
unknown one, is refused with every violation (docs/operations.md, "Operator actions").`
	if verb == "resume" {
		help = `Resume a paused tool: the commands of the calls held while it was paused are published in dispatch
order, each with its original deadline (calls whose deadline passed meanwhile ended timeout and are not
released). Through the server's POST /projects/{project_id}/tools/{tool_name}/resume; an admin credential.
Resuming a running tool is refused (and finishes a resume cut short).`
	}
	fs := newFlagSet("tools "+verb, "tools "+verb+" --project P --tool T --reason R [--json]", help)
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required)")
	tool := fs.String("tool", "", "tool name (required)")
	reason := fs.String("reason", "", "why, for the audit trail (required, at most 1024 bytes)")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	var missing []string
	for name, v := range map[string]string{"--project": *project, "--tool": *tool, "--reason": *reason} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return failf(exitUsage, "tools %s: %s required", verb, strings.Join(missing, ", "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	api, err := cf.api()
	if err != nil {
		return failf(exitFor(err), "tools %s: %v", verb, err)
	}
	act := api.PauseTool
	if verb == "resume" {
		act = api.ResumeTool
	}
	out, err := act(ctx, *project, *tool, *reason)
	if err != nil {
		err = cf.httpErr(err)
		return failf(exitFor(err), "tools %s: %v", verb, err)
	}
	// --json prints all four, released 0 included.
	res := struct {
		Seq      uint64 `json:"seq"`
		ToolName string `json:"tool_name"`
		Paused   bool   `json:"paused"`
		Released int    `json:"released"`
	}{out.Seq, out.ToolName, out.Paused, out.Released}
	if cf.asJSON {
		printJSON(res)
		return exitOK
	}
	if res.Paused {
		fmt.Fprintf(stdout, "paused %s in project %s (ledger seq %d): its new calls are held until resumed\n", res.ToolName, *project, res.Seq)
	} else {
		fmt.Fprintf(stdout, "resumed %s in project %s (ledger seq %d): %d held call(s) released\n", res.ToolName, *project, res.Seq, res.Released)
	}
	return exitOK
}
