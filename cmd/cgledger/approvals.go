package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cgledger/cgledger/httpclient"
	"github.com/cgledger/cgledger/protocol"
)

const approvalsUsage = `Usage:
  cgledger approvals list --project P [--state pending|decided|all]   held calls, oldest first
  cgledger approvals show --project P TURN CALL                        one held call: arguments, digest, decision
  cgledger approvals approve --project P TURN CALL (--digest D | --yes) [--reason R] [--approver NAME]
  cgledger approvals deny --project P TURN CALL (--digest D | --yes) [--reason R] [--approver NAME]
`

// approvals runs the approvals verbs, through serve's HTTP API
// (docs/approvals.md): listing and showing need an approver, auditor or
// admin credential of the project; deciding an approver credential, whose
// approver name the decision is recorded under.
func approvals(args []string) int {
	if code, done := groupHelp(args, approvalsUsage); done {
		return code
	}
	switch args[0] {
	case "list":
		return approvalsList(args[1:])
	case "show":
		return approvalsShow(args[1:])
	case "approve":
		return approvalsDecide(protocol.OpApprove, args[1:])
	case "deny":
		return approvalsDecide(protocol.OpDeny, args[1:])
	}
	return failf(exitUsage, "approvals: unknown subcommand %q (list, show, approve, deny)", args[0])
}

func approvalsList(args []string) int {
	fs := newFlagSet("approvals list", "approvals list --project P [--state pending|decided|all] [--json]",
		"List a project's calls held for approval, oldest first: pending (the default), decided, or all.")
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required)")
	state := fs.String("state", protocol.ApprovalPending, "pending, decided or all")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	var problems []string
	if *project == "" {
		problems = append(problems, "--project is required")
	}
	switch *state {
	case protocol.ApprovalPending, protocol.ApprovalListDecided, protocol.ApprovalListAll:
	default:
		problems = append(problems, fmt.Sprintf("--state must be pending, decided or all, got %q", *state))
	}
	if len(problems) > 0 {
		return failf(exitUsage, "approvals list: %s", strings.Join(problems, "; "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, err := cf.api()
	if err != nil {
		return failf(exitFor(err), "approvals list: %v", err)
	}
	var all []protocol.ApprovalItem
	var l httpclient.List
	for {
		page, err := api.Approvals(ctx, *project, *state, l)
		if err != nil {
			return failf(exitFor(cf.httpErr(err)), "approvals list: %v", cf.httpErr(err))
		}
		if cf.asJSON {
			fmt.Fprintln(stdout, string(bytes.TrimSpace(cf.answer)))
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
	for _, it := range all {
		fmt.Fprintf(stdout, "%-10s %-20s turn %s call %s  agent %s  requested %s  expires %s%s\n", it.State, it.ToolName, it.AgentTurnID, it.ToolCallID,
			it.AgentID, it.RequestedAt.Format(time.RFC3339), it.ExpiresAt.Format(time.RFC3339), decidedBy(it))
	}
	return exitOK
}

// decidedBy describes a held call's decision for a listing line.
func decidedBy(it protocol.ApprovalItem) string {
	if it.State == protocol.ApprovalPending {
		return ""
	}
	s := "  by " + it.Approver
	if it.Reason != "" {
		s += fmt.Sprintf(" (%s)", it.Reason)
	}
	return s
}

// showApproval fetches one held call.
func showApproval(ctx context.Context, cf *clientFlags, project, turn, call string) (protocol.ApprovalItem, json.RawMessage, error) {
	api, err := cf.api()
	if err != nil {
		return protocol.ApprovalItem{}, nil, err
	}
	ans, err := api.Approval(ctx, project, turn, call, httpclient.AsOf{})
	if err != nil {
		return protocol.ApprovalItem{}, nil, cf.httpErr(err)
	}
	return ans.Approval, cf.answer, nil
}

// printApproval writes what an approver decides on: the call, its
// arguments exactly as the ledger holds them, and their digest.
func printApproval(it protocol.ApprovalItem) {
	fmt.Fprintf(stdout, "call       %s of turn %s (agent %s, project %s)\n", it.ToolCallID, it.AgentTurnID, it.AgentID, it.ProjectID)
	fmt.Fprintf(stdout, "tool       %s\n", it.ToolName)
	fmt.Fprintf(stdout, "card       %s\n", it.ToolCallCardID)
	args := string(it.Arguments)
	if args == "" {
		args = "(the views hold no such card)"
	}
	fmt.Fprintf(stdout, "arguments  %s\n", args)
	fmt.Fprintf(stdout, "digest     %s\n", it.ArgumentsDigest)
	fmt.Fprintf(stdout, "requested  %s by %s; expires %s\n", it.RequestedAt.Format(time.RFC3339), it.RequestedBy, it.ExpiresAt.Format(time.RFC3339))
	if len(it.Approvers) > 0 {
		fmt.Fprintf(stdout, "approvers  %s\n", strings.Join(it.Approvers, ", "))
	}
	fmt.Fprintf(stdout, "state      %s%s\n", it.State, decidedBy(it))
}

func approvalsShow(args []string) int {
	fs := newFlagSet("approvals show", "approvals show --project P TURN CALL [--json]",
		"Show one held call: its arguments exactly as the ledger holds them, their digest (what approve and deny name), and its decision.")
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required)")
	pos, code, ok := parseOrExit(fs, args, 2)
	if !ok {
		return code
	}
	if *project == "" {
		return failf(exitUsage, "approvals show: --project is required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	it, raw, err := showApproval(ctx, &cf, *project, pos[0], pos[1])
	if err != nil {
		return failf(exitFor(err), "approvals show: %v", err)
	}
	if cf.asJSON {
		fmt.Fprintln(stdout, string(bytes.TrimSpace(raw)))
		return exitOK
	}
	printApproval(it)
	return exitOK
}

func approvalsDecide(op string, args []string) int {
	name := "approvals " + op
	fs := newFlagSet(name, name+" --project P TURN CALL (--digest D | --yes) [--reason R] [--approver NAME] [--json]",
		`Decide a held call as the credential's approver. The call is shown first (its arguments and
their digest). With --digest, the decision names that digest and the ledger refuses it (mismatch)
unless it is the digest of the call's arguments; without, the digest shown is the one decided on,
which --yes confirms.`)
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required)")
	digest := fs.String("digest", "", "the arguments digest decided on (sha256:...), as approvals show prints it")
	yes := fs.Bool("yes", false, "decide on the digest shown, without --digest")
	reason := fs.String("reason", "", "why (recorded with the decision; at most 1024 bytes)")
	approver := fs.String("approver", "", "the approver name, only for a serve without credentials (--no-auth), which takes it from the request; with credentials it is the credential's and the server refuses it here")
	pos, code, ok := parseOrExit(fs, args, 2)
	if !ok {
		return code
	}
	var problems []string
	if *project == "" {
		problems = append(problems, "--project is required")
	}
	if *digest == "" && !*yes {
		problems = append(problems, "pass --digest D (the digest approvals show prints) or --yes to decide on the digest shown")
	}
	if len(*reason) > protocol.MaxApprovalReasonBytes {
		problems = append(problems, fmt.Sprintf("--reason is %d bytes; the limit is %d", len(*reason), protocol.MaxApprovalReasonBytes))
	}
	if len(problems) > 0 {
		return failf(exitUsage, "%s: %s", name, strings.Join(problems, "; "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	it, _, err := showApproval(ctx, &cf, *project, pos[0], pos[1])
	if err != nil {
		return failf(exitFor(err), "%s: %v", name, err)
	}
	if !cf.asJSON {
		printApproval(it)
	}
	d := *digest
	if d == "" {
		d = it.ArgumentsDigest
	} else if d != it.ArgumentsDigest && !cf.asJSON {
		fmt.Fprintf(os.Stderr, "%s: --digest %s is not the digest shown (%s): the ledger decides on the call's arguments only, and will refuse it\n", name, d, it.ArgumentsDigest)
	}
	api, err := cf.api()
	if err != nil {
		return failf(exitFor(err), "%s: %v", name, err)
	}
	decide := api.Approve
	if op == protocol.OpDeny {
		decide = api.Deny
	}
	res, err := decide(ctx, *project, pos[0], pos[1], httpclient.Decision{ToolCallCardID: it.ToolCallCardID, ArgumentsDigest: d, Reason: *reason, Approver: *approver})
	if err != nil {
		err = cf.httpErr(err)
		return failf(exitFor(err), "%s: %v", name, err)
	}
	if cf.asJSON {
		printJSON(res)
		return exitOK
	}
	fmt.Fprintf(stdout, "%s (ledger seq %d)", res.Decision, res.Seq)
	if res.CommandSeq != 0 {
		fmt.Fprintf(stdout, "; command released at seq %d, deadline %s", res.CommandSeq, time.UnixMilli(res.DeadlineUnixMS).UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(stdout)
	return exitOK
}
