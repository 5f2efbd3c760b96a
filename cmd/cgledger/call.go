package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/httpclient"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

func randomID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func call(args []string) int {
	fs := newFlagSet("call", "call --project P --agent A --tool NAME --args JSON [--channel C] [--timeout D] [--turn ID] [--call-id ID] [--epoch N] [--after-execution suspend|terminate] [--json]",
		`Dispatch a real tool call through the protocol as a worker would: write the tool.call card,
publish the command on the tool's target subject, wait until the report reaches the agent's
Inbox, and print the result. Exit 0 only when the status is success. --turn, --call-id and
--epoch set the identity (generated when absent), so a call can be repeated on purpose: the
ledger answers a repeat with the original outcome.`)
	var cf clientFlags
	cf.register(fs)
	project := fs.String("project", "", "project id (required)")
	channel := fs.String("channel", "main", "channel id")
	agent := fs.String("agent", "", "agent id (required)")
	tool := fs.String("tool", "", "tool name (required)")
	argsJSON := fs.String("args", "{}", "tool arguments as a JSON object")
	timeout := fs.Duration("timeout", 30*time.Second, "the call's deadline; the verb waits for its result up to this plus 10s")
	turn := fs.String("turn", "", "agent_turn_id (generated when absent)")
	callID := fs.String("call-id", "", "tool_call_id (generated when absent)")
	epoch := fs.Uint64("epoch", 1, "turn_epoch")
	after := fs.String("after-execution", protocol.AfterSuspend, "suspend or terminate")
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	var missing []string
	for name, v := range map[string]string{"project": *project, "agent": *agent, "tool": *tool} {
		if v == "" {
			missing = append(missing, "--"+name)
		}
	}
	if len(missing) > 0 {
		return failf(exitUsage, "call: missing %v", missing)
	}
	if !json.Valid([]byte(*argsJSON)) || len(*argsJSON) == 0 || (*argsJSON)[0] != '{' {
		return failf(exitUsage, "call: --args must be a JSON object, got %q", *argsJSON)
	}
	if *after != protocol.AfterSuspend && *after != protocol.AfterTerminate {
		return failf(exitUsage, "call: --after-execution must be suspend or terminate, got %q", *after)
	}
	if *turn == "" {
		*turn = randomID("turn-")
	}
	if *callID == "" {
		*callID = randomID("call-")
	}
	ctx, cancel := cf.context(*timeout + 15*time.Second)
	defer cancel()
	nc, err := cf.connect()
	if err != nil {
		return failf(exitFor(err), "call: %v", err)
	}
	defer nc.Close()
	// Asked as the agent: a worker credential bound to an agent may act as
	// that agent only, tool.get included.
	cl := client.New(nc, client.WithActor(*agent))

	subject := protocol.ToolCommandSubject(protocol.DefaultVersion, *project, *channel, *tool)
	// A tool that is neither registered nor built in has no executor: say
	// so now, not only when the wait ends.
	unserved := ""
	if st, err := cl.GetTool(ctx, *project, *tool); err == nil {
		subject = st.Definition.TargetFor(*project, *channel)
	} else if errors.Is(err, protocol.ErrNotFound) || errors.Is(err, protocol.ErrBadRequest) {
		if *tool != "echo" && *tool != "sleep" {
			unserved = fmt.Sprintf("tool %s is not registered in project %s and is not a built-in (echo, sleep): no executor consumes %s, so unless a tool service of your own does, no result will come (register it: cgledger tools register FILE --project %s)", *tool, *project, subject, *project)
			fmt.Fprintf(os.Stderr, "cgledger call: warning: %s\n", unserved)
		}
	} else {
		err = cf.explain(ctx, err)
		return failf(exitFor(err), "call: read tool %s: %v", *tool, err)
	}
	// The card must be the same every time the same call is repeated (cards
	// are immutable), so its trace id derives from the identity.
	sum := sha256.Sum256([]byte(*project + "\x00" + *turn + "\x00" + *callID))
	traceID := hex.EncodeToString(sum[:16])
	id := protocol.Identity{AgentID: *agent, AgentTurnID: *turn, TurnEpoch: *epoch, ToolCallID: *callID,
		Traceparent: "00-" + traceID + "-" + randomID("") + "-01"}
	// Calls are keyed by (project, turn, call): the card id is too, so the
	// same --call-id in another turn is another card.
	cardID := "cc-" + hex.EncodeToString(sum[16:28])
	req := protocol.DispatchRequest{
		Subject: subject, Identity: id,
		Card: protocol.Card{CardID: cardID, ProjectID: *project, Type: protocol.CardToolCall, AuthorID: *agent,
			AgentTurnID: *turn, ToolCallID: *callID,
			Content:  json.RawMessage(fmt.Sprintf(`{"tool_name":%q,"arguments":%s}`, *tool, *argsJSON)),
			Metadata: protocol.CardMetadata{TraceID: traceID, ParentStepID: *turn, StepID: "step-" + *callID}},
		Payload: protocol.ToolCommandPayload{ToolCallCardID: cardID, ToolName: *tool, AfterExecution: *after, TimeoutMS: timeout.Milliseconds()},
	}
	d, err := cl.Dispatch(ctx, req)
	if err != nil {
		err = cf.explain(ctx, err)
		return failf(exitFor(err), "call: dispatch: %v", err)
	}
	if d.Duplicate && !cf.asJSON {
		fmt.Fprintf(os.Stderr, "cgledger call: turn %s call %s was dispatched before: the ledger answered with the original call (nothing new was run)\n", *turn, *callID)
	}
	identity := map[string]any{"project_id": *project, "channel_id": *channel, "agent_id": *agent, "agent_turn_id": *turn,
		"tool_call_id": *callID, "turn_epoch": *epoch, "subject": d.Subject, "tool_call_card_id": cardID, "duplicate_dispatch": d.Duplicate}

	// Wait until the report is projected into the agent's Inbox.
	var state projector.CallStateAnswer
	api, err := cf.api()
	if err != nil {
		return failf(exitFor(err), "call: %v", err)
	}
	deadline := time.Now().Add(*timeout + 10*time.Second)
	for {
		var err error
		state, err = api.CallState(ctx, *project, *turn, *callID, httpclient.AsOf{})
		err = cf.httpErr(err)
		if err == nil && state.Call.ReportedSeq != 0 {
			break
		}
		if errors.Is(err, errUnreachable) {
			return failf(exitUnreachable, "call: %v", err)
		}
		var ae *apiError
		if errors.As(err, &ae) && ae.Status != http.StatusNotFound {
			// Only "not reported yet" (404) is worth waiting out.
			return failf(exitFor(err), "call: the call was dispatched (turn %s call %s) but its result cannot be read from %s: %v", *turn, *callID, cf.server, err)
		}
		if errors.As(err, &ae) && strings.Contains(ae.Err.Message, "not served by this process") {
			return failf(exitFailed, "call: the call was dispatched (turn %s call %s) but %s (from %s) does not serve the views its result is read from: %v; point --server at a serve with the projector role",
				*turn, *callID, cf.server, cf.from("server"), err)
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("call: no result for turn %s call %s after %s (the call's --timeout %s plus 10s for its report to be recorded); cgledger audit call %s --project %s shows where it stands",
				*turn, *callID, *timeout+10*time.Second, *timeout, *callID, *project)
			if unserved != "" {
				msg += "; " + unserved
			}
			return failf(exitFailed, "%s", msg)
		}
		select {
		case <-ctx.Done():
			return failf(exitFailed, "call: %v", cf.explain(ctx, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
	cards, _, err := cl.GetCards(ctx, *project, []string{state.Call.ToolResultCardID})
	err = cf.explain(ctx, err)
	if err != nil {
		return failf(exitFor(err), "call: read result card %s: %v", state.Call.ToolResultCardID, err)
	}
	if len(cards) != 1 {
		// The report names a card the ledger does not hold (any more): not
		// a success, whatever the report says.
		return failf(exitFailed, "call: the report names result card %s, which the ledger does not hold; cgledger audit call %s --project %s shows the call",
			state.Call.ToolResultCardID, *callID, *project)
	}
	tr, _ := cards[0].Card.ToolResult()
	if cf.asJSON {
		printJSON(map[string]any{"identity": identity, "report": state.Call, "result_card": cards[0]})
	} else {
		fmt.Fprintf(stdout, "status:     %s\n", tr.Status)
		fmt.Fprintf(stdout, "tool:       %s (%s)\n", *tool, d.Subject)
		fmt.Fprintf(stdout, "call:       project=%s channel=%s agent=%s turn=%s call=%s epoch=%d\n", *project, *channel, *agent, *turn, *callID, *epoch)
		fmt.Fprintf(stdout, "ledger:     card seq %d, command seq %d, report seq %d\n", d.CardSeq, d.CommandSeq, state.Call.ReportedSeq)
		fmt.Fprintf(stdout, "after:      %s (effective %s)\n", state.Call.AfterExecution, state.Call.EffectiveAfterExecution)
		fmt.Fprintf(stdout, "result:     %s\n", string(tr.Result))
		if tr.Error != nil {
			fmt.Fprintf(stdout, "error:      %s: %s\n", tr.Error.Code, tr.Error.Message)
			if len(tr.Error.Detail) > 0 {
				fmt.Fprintf(stdout, "detail:     %s\n", string(tr.Error.Detail))
			}
		}
	}
	if tr.Status != protocol.StatusSuccess {
		return exitFailed
	}
	return exitOK
}
