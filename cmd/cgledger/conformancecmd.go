package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cgledger/cgledger/conformance"
)

// conformanceCmd drives a running tool service through the protocol's golden
// and error cases (docs/conformance.md) and prints the table; exit 1 when a
// case fails.
func conformanceCmd(args []string) int {
	fs := newFlagSet("conformance", "conformance --project P --tool T [--fixture FILE] [--case C,...] [--run ID] [--actor NAME] [--grace D] [--settle D] [--timeout D] [--json]",
		`Drive the tool service of tool target T (any language, already running and consuming its
commands) through the protocol's golden and error cases, and print, per case, what was
expected, what the ledger saw and pass, fail or not_applicable. Exit 1 when any case fails.
Needs an admin credential of the project (the cases append commands no dispatch would publish,
with conformance.command, and read what the service did with conformance.observe). Run it
against a tool with no other traffic: one case pauses the tool for a moment. The fixture
(docs/conformance.md) names the arguments that make the tool produce each status, a long call,
and the tool's determinism; without one, the normal call has arguments {}.`)
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required; the credential must administer it)")
	tool := fs.String("tool", "", "tool target to check (required)")
	fixturePath := fs.String("fixture", "", "the tool's fixture file (YAML or JSON)")
	cases := fs.String("case", "", "run only these cases (comma-separated ids; all when empty)")
	runID := fs.String("run", "", "run id (an identifier; random when empty): calls are dispatched as agent conformance-<run>")
	actor := fs.String("actor", "conformance", "the admin's actor token, recorded as who acted")
	grace := fs.Duration("grace", 5*time.Second, "the ledger's deadline grace (serve --deadline-grace)")
	settle := fs.Duration("settle", 30*time.Second, "how long a case waits for the service to acknowledge a command")
	timeout := fs.Duration("timeout", 15*time.Minute, "bound on the whole run")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	var problems []string
	if *project == "" {
		problems = append(problems, "--project is required")
	}
	if *tool == "" {
		problems = append(problems, "--tool is required")
	}
	if len(problems) > 0 {
		return failf(exitUsage, "conformance: %s", strings.Join(problems, "; "))
	}
	var raw []byte
	if *fixturePath != "" {
		b, err := os.ReadFile(*fixturePath)
		if err != nil {
			return failf(exitUsage, "conformance: read fixture: %v", err)
		}
		raw = b
	}
	fx, err := conformance.ParseFixture(raw, *tool)
	if err != nil {
		return failf(exitUsage, "conformance: %v", err)
	}
	var only, unknown []string
	for _, c := range strings.Split(*cases, ",") {
		if c = strings.TrimSpace(c); c != "" {
			only = append(only, c)
			if !slices.Contains(conformance.Cases(), c) {
				unknown = append(unknown, strconv.Quote(c))
			}
		}
	}
	// Checked here, before connecting, so that a mistyped case is a usage
	// error (exit 2) like every other bad flag.
	if len(unknown) > 0 {
		return failf(exitUsage, "conformance: unknown case %s (cases: %s)", strings.Join(unknown, ", "), strings.Join(conformance.Cases(), ", "))
	}
	ctx, cancel := cf.context(*timeout)
	defer cancel()
	nc, err := cf.connect()
	if err != nil {
		return failf(exitFor(err), "conformance: %v", err)
	}
	defer nc.Close()
	cfg := conformance.Config{Conn: nc, Project: *project, Fixture: fx, Actor: *actor,
		Run: *runID, Cases: only, Grace: *grace, Settle: *settle}
	// Progress goes to stderr in both modes: with --json stdout carries
	// only the report.
	cfg.Progress = func(c conformance.CaseResult) {
		fmt.Fprintf(os.Stderr, "cgledger conformance: %s %s (%d ms)\n", c.Case, c.Outcome, c.DurationMS)
	}
	rep, err := conformance.Run(ctx, cfg)
	if err != nil {
		err = cf.explain(ctx, err)
		return failf(exitFor(err), "%v", err)
	}
	if cf.asJSON {
		printJSON(rep)
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "CASE\tOUTCOME\tEXPECTED\tSEEN")
		for _, c := range rep.Cases {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Case, c.Outcome, c.Expected, c.Seen)
		}
		_ = tw.Flush()
		fmt.Fprintf(stdout, "run %s (agent %s): %d passed, %d failed, %d not applicable\n", rep.Run, rep.Agent, rep.Passed, rep.Failed, rep.NotApplicable)
	}
	if !rep.OK() {
		return exitFailed
	}
	return exitOK
}
