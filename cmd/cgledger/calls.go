package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cgledger/cgledger/httpclient"
	"github.com/cgledger/cgledger/protocol"
)

const callsUsage = `Usage:
  cgledger calls cancel --project P --turn T --call C --reason R [--actor NAME]
  cgledger calls resolve --project P --turn T --call C --effect applied|not_applied --reason R [--actor NAME]
  cgledger calls redrive --project P --turn T --call C --reason R [--actor NAME]
`

// calls runs the operator actions on calls, through serve's HTTP API
// (docs/operations.md, "Operator actions"): an admin credential of the
// project, whose actor (its label, else "admin") the entry records.
func calls(args []string) int {
	if code, done := groupHelp(args, callsUsage); done {
		return code
	}
	switch args[0] {
	case "cancel":
		return callsAct(protocol.OpCallCancel, args[1:])
	case "resolve":
		return callsAct(protocol.OpCallResolve, args[1:])
	case "redrive":
		return callsAct(protocol.OpCallRedrive, args[1:])
	}
	return failf(exitUsage, "calls: unknown subcommand %q (cancel, resolve, redrive)", args[0])
}

func callsAct(op string, args []string) int {
	action := strings.TrimPrefix(op, "call.")
	name := "calls " + action
	synopsis, help := name+" --project P --turn T --call C --reason R [--actor NAME] [--json]",
		`Cancel any agent's call as an operator: a running call gets its cancel entry (its executor
stops it and reports canceled), a call held for approval the decision canceled. A call that
already has a report cannot be canceled.`
	if op == protocol.OpCallResolve {
		synopsis, help = name+" --project P --turn T --call C --effect applied|not_applied --reason R [--actor NAME] [--json]",
			`Record what became of the side effect of a call whose effect is unknown (reported failed with
S-TOOL-OUTCOME-UNKNOWN, or a side_effectful tool's call reported timeout after its attempt
started): applied or not_applied, once per call. The call's report is left as it is.`
	}
	if op == protocol.OpCallRedrive {
		help = `Run a call reported failed or timeout again as a new call derived from it, <call>~r<n>:
the same agent, turn, tool, arguments and idempotency key. The failed call keeps its report;
the derived call gets its own and wakes the same agent. A side_effectful tool's call whose
outcome is unknown needs a resolution not_applied first (calls resolve). Once per call.`
	}
	fs := newFlagSet(name, synopsis, help)
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required)")
	turn := fs.String("turn", "", "the call's agent_turn_id (required)")
	call := fs.String("call", "", "the call's tool_call_id (required)")
	reason := fs.String("reason", "", "why (required; recorded with the entry; at most 1024 bytes)")
	actor := fs.String("actor", "", "the operator's actor token, only for a serve without credentials (--no-auth), which takes it from the request; with credentials it is the admin credential's and the server refuses it here")
	var effect *string
	if op == protocol.OpCallResolve {
		effect = fs.String("effect", "", "applied or not_applied (required)")
	}
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	var problems []string
	for _, f := range []struct{ flag, v string }{{"--project", *project}, {"--turn", *turn}, {"--call", *call}, {"--reason", *reason}} {
		if f.v == "" {
			problems = append(problems, f.flag+" is required")
		}
	}
	if len(*reason) > protocol.MaxOperatorReasonBytes {
		problems = append(problems, fmt.Sprintf("--reason is %d bytes; the limit is %d", len(*reason), protocol.MaxOperatorReasonBytes))
	}
	body := httpclient.Operator{Reason: *reason, Actor: *actor}
	if effect != nil {
		switch *effect {
		case protocol.EffectApplied, protocol.EffectNotApplied:
			body.Effect = *effect
		case "":
			problems = append(problems, "--effect is required (applied or not_applied)")
		default:
			problems = append(problems, fmt.Sprintf("--effect must be applied or not_applied, got %q", *effect))
		}
	}
	if len(problems) > 0 {
		return failf(exitUsage, "%s: %s", name, strings.Join(problems, "; "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, err := cf.api()
	if err != nil {
		return failf(exitFor(err), "%s: %v", name, err)
	}
	// Each action's answer, printed as received with --json.
	var show func()
	switch op {
	case protocol.OpCallRedrive:
		var res protocol.RedriveResult
		res, err = api.RedriveCall(ctx, *project, *turn, *call, body)
		show = func() {
			how := "redriven"
			if res.Duplicate {
				how = "already redriven"
			}
			state := "dispatched"
			switch {
			case res.Dispatch.AwaitingApproval:
				state = "awaiting approval"
			case res.Dispatch.Paused:
				state = "held by a pause of its tool"
			}
			fmt.Fprintf(stdout, "%s as %s (%s; ledger seq %d)\n", how, res.RedriveCallID, state, res.Seq)
		}
	case protocol.OpCallResolve:
		var res protocol.ResolveResult
		res, err = api.ResolveCall(ctx, *project, *turn, *call, body)
		show = func() { fmt.Fprintf(stdout, "resolved %s (ledger seq %d)\n", res.Effect, res.Seq) }
	default:
		var res protocol.OperatorCancelResult
		res, err = api.CancelCall(ctx, *project, *turn, *call, body)
		show = func() {
			how := "cancel entry"
			if res.Entry == protocol.KindApproval {
				how = "approval decision canceled"
			}
			if res.Duplicate {
				fmt.Fprintf(stdout, "already canceled (%s, ledger seq %d)\n", how, res.Seq)
				return
			}
			fmt.Fprintf(stdout, "canceled (%s, ledger seq %d)\n", how, res.Seq)
		}
	}
	if err != nil {
		err = cf.httpErr(err)
		return failf(exitFor(err), "%s: %v", name, err)
	}
	if cf.asJSON {
		fmt.Fprintln(stdout, string(bytes.TrimSpace(cf.answer)))
		return exitOK
	}
	show()
	return exitOK
}
