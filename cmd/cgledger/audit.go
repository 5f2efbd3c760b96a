package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/cgledger/cgledger/projector"
)

const auditHelp = `Read history from the server's views (the audit HTTP API, docs/audit-api.md):

  cgledger audit turn TURN --project P     every entry of a turn, in ledger order
  cgledger audit call CALL --project P [--turn T]
                                           a call's story: its state and every entry
  cgledger audit agent AGENT --project P [--state pending|consumed|all]
                                           the agent's Inbox
  cgledger audit card CARD --project P     a card and its versions

Every audit takes --as-of-seq N or --as-of TIME to answer as the views stood then, and --json.`

func audit(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" || args[0] == "help" {
		fmt.Fprintln(os.Stderr, auditHelp)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	kind := args[0]
	switch kind {
	case "turn", "call", "agent", "card":
	default:
		return failf(exitUsage, "audit: unknown kind %q (turn, call, agent, card)", kind)
	}
	fs := newFlagSet("audit "+kind, "audit "+kind+" ID --project P [--as-of-seq N | --as-of TIME] [--json]", auditHelp)
	var cf clientFlags
	cf.register(fs, false, true)
	var at asOfFlags
	at.register(fs)
	project := fs.String("project", "", "project id (required)")
	turn := fs.String("turn", "", "audit call: narrow to one turn")
	state := fs.String("state", "all", "audit agent: pending, consumed or all")
	pos, code, ok := parseOrExit(fs, args[1:], 1)
	if !ok {
		return code
	}
	if *project == "" {
		return failf(exitUsage, "audit %s: --project is required", kind)
	}
	q, err := at.values()
	if err != nil {
		return failf(exitUsage, "audit %s: %v", kind, err)
	}
	id := url.PathEscape(pos[0])
	base := "/v1/projects/" + url.PathEscape(*project)
	var path string
	switch kind {
	case "turn":
		path = base + "/turns/" + id + "/timeline"
	case "call":
		path = base + "/calls/" + id
		if *turn != "" {
			q.Set("turn", *turn)
		}
	case "agent":
		path = base + "/agents/" + id + "/inbox"
		q.Set("state", *state)
		q.Set("limit", "1000")
	case "card":
		path = base + "/cards/" + id
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var raw json.RawMessage
	if err := cf.httpDo(ctx, "GET", path, q, nil, &raw); err != nil {
		return failf(exitFor(err), "audit %s: %v", kind, err)
	}
	if cf.asJSON {
		fmt.Fprintln(stdout, string(bytes.TrimSpace(raw)))
		return exitOK
	}
	switch kind {
	case "turn":
		var tl projector.Timeline
		if err := json.Unmarshal(raw, &tl); err != nil {
			return failf(exitFailed, "audit %s: the server's answer does not decode: %v (--json prints it as received)", kind, err)
		}
		fmt.Fprintf(stdout, "turn %s in project %s, as of seq %d: %d entries\n", tl.AgentTurnID, tl.ProjectID, tl.AsOfSeq, len(tl.Items))
		printItems(tl.Items)
	case "call":
		var st projector.CallStory
		if err := json.Unmarshal(raw, &st); err != nil {
			return failf(exitFailed, "audit %s: the server's answer does not decode: %v (--json prints it as received)", kind, err)
		}
		fmt.Fprintf(stdout, "call %s in project %s, as of seq %d\n", st.ToolCallID, st.ProjectID, st.AsOfSeq)
		for _, c := range st.Calls {
			fmt.Fprintf(stdout, "  turn %s: %s", c.AgentTurnID, c.State)
			if c.Status != "" {
				fmt.Fprintf(stdout, ", status %s, result card %s, after_execution %s (effective %s)", c.Status, c.ToolResultCardID, c.AfterExecution, c.EffectiveAfterExecution)
			}
			fmt.Fprintf(stdout, ", %d duplicate(s), %d rejection(s)\n", c.Duplicates, c.Rejections)
		}
		printItems(st.Items)
	case "agent":
		var in projector.Page[projector.InboxEntry]
		if err := json.Unmarshal(raw, &in); err != nil {
			return failf(exitFailed, "audit %s: the server's answer does not decode: %v (--json prints it as received)", kind, err)
		}
		fmt.Fprintf(stdout, "inbox of agent %s in project %s, as of seq %d: %d entries\n", pos[0], *project, in.AsOfSeq, len(in.Items))
		for _, e := range in.Items {
			fmt.Fprintf(stdout, "  seq %-6d %-9s %-8s turn %s call %s tool %s card %s after %s\n", e.ReportSeq, e.State, e.Status, e.AgentTurnID, e.ToolCallID, e.ToolName, e.ToolResultCardID, e.EffectiveAfterExecution)
		}
	case "card":
		var c projector.CardResult
		if err := json.Unmarshal(raw, &c); err != nil {
			return failf(exitFailed, "audit %s: the server's answer does not decode: %v (--json prints it as received)", kind, err)
		}
		fmt.Fprintf(stdout, "card %s in project %s, as of seq %d: %d version(s)\n", pos[0], *project, c.AsOfSeq, len(c.Versions))
		for _, v := range c.Versions {
			fmt.Fprintf(stdout, "  seq %d at %s\n    %s\n", v.Seq, v.Time.Format(time.RFC3339Nano), string(v.Card))
		}
	}
	return exitOK
}

func printItems(items []projector.TimelineItem) {
	for _, it := range items {
		summary := string(it.Data)
		if len(summary) > 160 {
			summary = summary[:157] + "..."
		}
		t := "-"
		if !it.Time.IsZero() {
			t = it.Time.Format("15:04:05.000")
		}
		fmt.Fprintf(stdout, "  seq %-6d %s %-14s %s\n      %s\n", it.Seq, t, it.Kind, it.Subject, strings.TrimSpace(summary))
	}
}
