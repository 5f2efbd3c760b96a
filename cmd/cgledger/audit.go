package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/httpclient"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

const auditHelp = `Read history from the server's views (the audit HTTP API, docs/audit-api.md):

  cgledger audit projects                  the projects the ledger holds
  cgledger audit calls --project P [--tool T] [--agent A] [--status S] [--state S]
                       [--channel C] [--since TIME] [--until TIME]
                                           the project's calls, filtered, in dispatch order
  cgledger audit turn TURN --project P     every entry of a turn, in ledger order
  cgledger audit call CALL --project P [--turn T]
                                           a call's story: its state and every entry
  cgledger audit agent AGENT --project P [--state pending|consumed|all]
                                           the agent's Inbox
  cgledger audit card CARD --project P     a card and its versions

Every audit takes --as-of-seq N or --as-of TIME to answer as the views stood then, the
connection flags of every client verb, and --json (the server's answer as it is). Lists
(projects, calls, agent) take --limit N and --cursor C and print the cursor of the next
page; --all follows every page. Run "cgledger audit KIND --help" for a kind's flags.`

// auditKind is one audit sub-verb: its synopsis, its own flags and how it
// reads and prints.
type auditKind struct {
	synopsis string
	about    string
	// args is the number of positional arguments (the id), 0 or 1.
	args int
	// paged lists take --limit, --cursor and --all.
	paged bool
	flags func(fs *flag.FlagSet) func(q *auditQuery) error
	fetch func(ctx context.Context, api *httpclient.Client, project, id string, q auditQuery) (auditPage, error)
}

// auditQuery is what the flags of an audit ask for: the as-of point and
// page, and each kind's own filters.
type auditQuery struct {
	list httpclient.List
	// calls filters audit calls; turn narrows audit call; state selects
	// audit agent's entries.
	calls httpclient.CallFilter
	turn  string
	state string
}

// auditPage is one answer of an audit kind: how to print it, and where its
// listing goes on (next is empty on the last page).
type auditPage struct {
	print   func()
	next    string
	asOfSeq uint64
}

var auditKinds = map[string]auditKind{
	"projects": {
		synopsis: "audit projects [--limit N] [--cursor C] [--all]",
		about:    "List the projects the ledger holds (GET /v1/projects; needs a credential of every project).",
		paged:    true,
		fetch: func(ctx context.Context, api *httpclient.Client, _, _ string, q auditQuery) (auditPage, error) {
			p, err := api.Projects(ctx, q.list)
			return auditPage{next: p.NextCursor, asOfSeq: p.AsOfSeq, print: func() {
				fmt.Fprintf(stdout, "projects, as of seq %d: %d on this page\n", p.AsOfSeq, len(p.Items))
				for _, it := range p.Items {
					// stamp prints "-" for a first entry without a time.
					fmt.Fprintf(stdout, "  %-24s first entry seq %d at %s\n", it.ProjectID, it.FirstSeq, stamp(it.FirstTime))
				}
			}}, err
		},
	},
	"calls": {
		synopsis: "audit calls --project P [--tool T] [--agent A] [--status S] [--state S] [--channel C] [--since TIME] [--until TIME] [--limit N] [--cursor C] [--all]",
		about:    "List a project's calls in dispatch order, filtered (GET /v1/projects/P/calls).",
		paged:    true,
		flags: func(fs *flag.FlagSet) func(*auditQuery) error {
			tool := fs.String("tool", "", "only calls of this tool")
			agent := fs.String("agent", "", "only calls of this agent")
			status := fs.String("status", "", "only calls whose result has this status (success, failed, ...)")
			state := fs.String("state", "", "only calls in this state: dispatched, reported, consumed or rejected")
			channel := fs.String("channel", "", "only calls on this channel")
			since := fs.String("since", "", "only calls dispatched at or after this time (RFC 3339)")
			until := fs.String("until", "", "only calls dispatched at or before this time (RFC 3339)")
			return func(q *auditQuery) error {
				q.calls = httpclient.CallFilter{Tool: *tool, Agent: *agent, Status: *status, State: *state, Channel: *channel}
				var problems []string
				var bounds [2]time.Time
				for i, p := range []struct{ flag, v string }{{"since", *since}, {"until", *until}} {
					if p.v == "" {
						continue
					}
					t, err := time.Parse(time.RFC3339Nano, p.v)
					if err != nil {
						problems = append(problems, fmt.Sprintf("--%s %q: want an RFC 3339 time such as 2026-11-22T10:00:00Z", p.flag, p.v))
						continue
					}
					bounds[i] = t
				}
				q.calls.From, q.calls.To = bounds[0], bounds[1]
				if !bounds[0].IsZero() && !bounds[1].IsZero() && bounds[1].Before(bounds[0]) {
					problems = append(problems, "--until is before --since")
				}
				if len(problems) > 0 {
					return errors.New(strings.Join(problems, "\n"))
				}
				return nil
			}
		},
		fetch: func(ctx context.Context, api *httpclient.Client, project, _ string, q auditQuery) (auditPage, error) {
			p, err := api.Calls(ctx, project, q.calls, q.list)
			return auditPage{next: p.NextCursor, asOfSeq: p.AsOfSeq, print: func() { printCalls(project, p) }}, err
		},
	},
	"turn": {
		synopsis: "audit turn TURN --project P",
		about:    "Every entry of a turn, in ledger order, with its full data (GET /v1/projects/P/turns/TURN/timeline).",
		args:     1,
		fetch: func(ctx context.Context, api *httpclient.Client, project, id string, q auditQuery) (auditPage, error) {
			tl, err := api.Timeline(ctx, project, id, q.list.AsOf)
			return auditPage{asOfSeq: tl.AsOfSeq, print: func() {
				fmt.Fprintf(stdout, "turn %s in project %s, as of seq %d: %d entries\n", tl.AgentTurnID, tl.ProjectID, tl.AsOfSeq, len(tl.Items))
				printItems(tl.Items)
			}}, err
		},
	},
	"call": {
		synopsis: "audit call CALL --project P [--turn T]",
		about:    "A call's story: its state in each turn using the id and every entry, with full data (GET /v1/projects/P/calls/CALL).",
		args:     1,
		flags: func(fs *flag.FlagSet) func(*auditQuery) error {
			turn := fs.String("turn", "", "only the call of this turn (call ids may repeat across turns)")
			return func(q *auditQuery) error {
				q.turn = *turn
				return nil
			}
		},
		fetch: func(ctx context.Context, api *httpclient.Client, project, id string, q auditQuery) (auditPage, error) {
			st, err := api.CallStory(ctx, project, id, q.turn, q.list.AsOf)
			return auditPage{asOfSeq: st.AsOfSeq, print: func() { printStory(st) }}, err
		},
	},
	"agent": {
		synopsis: "audit agent AGENT --project P [--state pending|consumed|all] [--limit N] [--cursor C] [--all]",
		about:    "The agent's Inbox in arrival order (GET /v1/projects/P/agents/AGENT/inbox).",
		args:     1,
		paged:    true,
		flags: func(fs *flag.FlagSet) func(*auditQuery) error {
			state := fs.String("state", "all", "pending, consumed or all")
			return func(q *auditQuery) error {
				switch *state {
				case "pending", "consumed", "all":
				default:
					return fmt.Errorf("--state %q: want pending, consumed or all", *state)
				}
				q.state = *state
				return nil
			}
		},
		fetch: func(ctx context.Context, api *httpclient.Client, project, id string, q auditQuery) (auditPage, error) {
			in, err := api.Inbox(ctx, project, id, q.state, q.list)
			return auditPage{next: in.NextCursor, asOfSeq: in.AsOfSeq, print: func() {
				fmt.Fprintf(stdout, "inbox of agent %s in project %s, as of seq %d: %d on this page\n", id, project, in.AsOfSeq, len(in.Items))
				for _, e := range in.Items {
					fmt.Fprintf(stdout, "  seq %-6d %s %-9s %-8s turn %s call %s tool %s card %s after %s\n", e.ReportSeq, stamp(e.ReportedAt), e.State, e.Status, e.AgentTurnID, e.ToolCallID, e.ToolName, e.ToolResultCardID, e.EffectiveAfterExecution)
				}
			}}, err
		},
	},
	"card": {
		synopsis: "audit card CARD --project P",
		about:    "A card and every version of it (GET /v1/projects/P/cards/CARD).",
		args:     1,
		fetch: func(ctx context.Context, api *httpclient.Client, project, id string, q auditQuery) (auditPage, error) {
			c, err := api.Card(ctx, project, id, q.list.AsOf)
			return auditPage{asOfSeq: c.AsOfSeq, print: func() {
				fmt.Fprintf(stdout, "card %s in project %s, as of seq %d: %d version(s)\n", id, project, c.AsOfSeq, len(c.Versions))
				for _, v := range c.Versions {
					fmt.Fprintf(stdout, "  seq %d at %s\n%s\n", v.Seq, stamp(v.Time), pretty(v.Card, "    "))
				}
			}}, err
		},
	},
}

func audit(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" || args[0] == "help" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, auditHelp)
			return exitUsage
		}
		fmt.Fprintln(stdout, auditHelp)
		return exitOK
	}
	name := args[0]
	kind, ok := auditKinds[name]
	if !ok {
		return failf(exitUsage, "audit: unknown kind %q (projects, calls, turn, call, agent, card; see cgledger audit --help)", name)
	}
	fs := newFlagSet("audit "+name, kind.synopsis+" [--as-of-seq N | --as-of TIME] [--json]", kind.about+"\n\n"+auditHelp)
	var cf clientFlags
	cf.register(fs)
	var at asOfFlags
	at.register(fs)
	var project *string
	if name != "projects" {
		project = fs.String("project", "", "project id (required)")
	}
	var extra func(*auditQuery) error
	if kind.flags != nil {
		extra = kind.flags(fs)
	}
	var limit int
	var cursor string
	var all bool
	if kind.paged {
		fs.IntVar(&limit, "limit", 0, "items per page, 1 to 1000 (the server's default is 100)")
		fs.StringVar(&cursor, "cursor", "", "continue from this cursor (printed after a page)")
		fs.BoolVar(&all, "all", false, "follow every page to the end")
	}
	pos, code, ok := parseOrExit(fs, args[1:], kind.args)
	if !ok {
		return code
	}
	p := ""
	if project != nil {
		if *project == "" {
			return failf(exitUsage, "audit %s: --project is required", name)
		}
		p = *project
	}
	id := ""
	if kind.args == 1 {
		id = pos[0]
	}
	// Every problem with the flags at once.
	var problems []string
	var q auditQuery
	var err error
	if q.list.AsOf, err = at.asOf(); err != nil {
		problems = append(problems, err.Error())
	}
	if extra != nil {
		if err := extra(&q); err != nil {
			problems = append(problems, strings.Split(err.Error(), "\n")...)
		}
	}
	limitSet := false
	fs.Visit(func(f *flag.Flag) { limitSet = limitSet || f.Name == "limit" })
	if limitSet && (limit < 1 || limit > 1000) {
		problems = append(problems, fmt.Sprintf("--limit must be from 1 to 1000, got %d", limit))
	}
	if len(problems) > 0 {
		return failf(exitUsage, "audit %s:\n  %s", name, strings.Join(problems, "\n  "))
	}
	q.list.Limit = limit
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	api, err := cf.api()
	if err != nil {
		return failf(exitFor(err), "audit %s: %v", name, err)
	}
	for {
		q.list.Cursor = cursor
		page, err := kind.fetch(ctx, api, p, id, q)
		if err != nil {
			err = cf.httpErr(err)
			return failf(exitFor(err), "audit %s: %v", name, err)
		}
		if cf.asJSON {
			fmt.Fprintln(stdout, string(bytes.TrimSpace(cf.answer)))
		} else {
			page.print()
		}
		if !all || page.next == "" {
			if !cf.asJSON && kind.paged && page.next != "" {
				fmt.Fprintf(stdout, "next page: --cursor %s\n", page.next)
			}
			return exitOK
		}
		cursor = page.next
		// The as-of of the first page holds for the rest: pages of one
		// listing answer for one sequence.
		if page.asOfSeq > 0 {
			q.list.AsOf = httpclient.AsOf{Seq: page.asOfSeq}
		}
	}
}

// stamp formats a time for people: the date, the time to the millisecond and
// the zone (UTC), so lines from different days and machines compare.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// pretty indents JSON for reading, every line prefixed; anything else is
// printed as it is.
func pretty(raw json.RawMessage, prefix string) string {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, prefix, "  "); err != nil {
		return prefix + string(raw)
	}
	return prefix + b.String()
}

func printItems(items []projector.TimelineItem) {
	for _, it := range items {
		fmt.Fprintf(stdout, "  seq %-6d %s %-14s %s\n", it.Seq, stamp(it.Time), it.Kind, it.Subject)
		if it.Reason != "" {
			fmt.Fprintf(stdout, "      reason: %s\n", it.Reason)
		}
		// A command a conformance run appended (conformance.command) is
		// no dispatch's: say so, or it reads as a malformed command.
		if run := protocol.HeaderGet(nats.Header(it.Headers), protocol.HeaderConformance); run != "" {
			fmt.Fprintf(stdout, "      conformance %s/%s\n", run, protocol.HeaderGet(nats.Header(it.Headers), protocol.HeaderConformanceCase))
		}
		fmt.Fprintln(stdout, pretty(it.Data, "      "))
	}
}

// printCalls prints a page of audit calls.
func printCalls(project string, p projector.Page[projector.CallState]) {
	fmt.Fprintf(stdout, "calls of project %s, as of seq %d: %d on this page\n", project, p.AsOfSeq, len(p.Items))
	for _, c := range p.Items {
		at := "-"
		if c.DispatchedAt != nil {
			at = stamp(*c.DispatchedAt)
		}
		status := c.Status
		if status == "" {
			status = "-"
		}
		fmt.Fprintf(stdout, "  %s  %-10s %-8s tool %-12s agent %s turn %s call %s\n", at, c.State, status, c.ToolName, c.AgentID, c.AgentTurnID, c.ToolCallID)
		if c.LastRejection != "" {
			fmt.Fprintf(stdout, "      last rejection: %s\n", c.LastRejection)
		}
	}
}

// printStory prints audit call's answer.
func printStory(st projector.CallStory) {
	fmt.Fprintf(stdout, "call %s in project %s, as of seq %d\n", st.ToolCallID, st.ProjectID, st.AsOfSeq)
	for _, c := range st.Calls {
		fmt.Fprintf(stdout, "  turn %s: %s", c.AgentTurnID, c.State)
		if c.Status != "" {
			fmt.Fprintf(stdout, ", status %s, result card %s, after_execution %s (effective %s)", c.Status, c.ToolResultCardID, c.AfterExecution, c.EffectiveAfterExecution)
		}
		fmt.Fprintf(stdout, ", %d duplicate(s), %d rejection(s)\n", c.Duplicates, c.Rejections)
		if c.LastRejection != "" {
			fmt.Fprintf(stdout, "    last rejection: %s\n", c.LastRejection)
		}
	}
	printItems(st.Items)
}
