package mcpfront

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cgledger/cgledger/protocol"
)

// TurnEpoch is the turn_epoch of every call of the front door: a session is
// one turn that never moves to another epoch.
const TurnEpoch = 1

// ToolCallIDFromRequestID is the tool_call_id a JSON-RPC request id stands
// for: "rpc-" and the id as JSON (rpc-7, rpc-"a1"), so the number 7 and the
// string "7" are different calls; an id whose JSON is not an identifier
// part (a dot, a space, non-ASCII, too long) is "rpc-h" and 32 hex digits
// of its SHA-256. raw is the id's JSON text.
func ToolCallIDFromRequestID(raw json.RawMessage) string {
	id := "rpc-" + string(raw)
	if protocol.ValidIdentifier(id) && len(id) <= 200 {
		return id
	}
	sum := sha256.Sum256(raw)
	return "rpc-h" + hex.EncodeToString(sum[:16])
}

// callIdentity reads the call's ids from _meta. An id given as a string is
// taken as given, valid or not: the dispatch carries it, and the ledger
// refuses (and records) one that is no identifier. vs are the problems no
// dispatch can carry as they were sent (an id that is not a string, a
// request with no id at all, a timeout that is not a whole number of
// milliseconds in range): the front door refuses those itself.
func (f *Front) callIdentity(ss *mcp.ServerSession, meta mcp.Meta) (turn, call string, timeoutMS int64, vs []protocol.Violation) {
	turn = f.turn(ss)
	if v, ok := meta[MetaAgentTurnID]; ok {
		if s, isStr := v.(string); isStr {
			turn = s
		} else {
			vs = append(vs, protocol.Violation{Field: "_meta." + MetaAgentTurnID, Code: protocol.VInvalidType, Message: "must be a string, an identifier (docs/protocol.md#identifiers)"})
		}
	}
	idGiven := false
	if v, ok := meta[MetaToolCallID]; ok {
		idGiven = true
		if s, isStr := v.(string); isStr {
			call = s
		} else {
			vs = append(vs, protocol.Violation{Field: "_meta." + MetaToolCallID, Code: protocol.VInvalidType, Message: "must be a string, an identifier (docs/protocol.md#identifiers)"})
		}
	}
	if !idGiven {
		if v, ok := meta[MetaRequestID]; ok {
			if raw, err := json.Marshal(v); err == nil {
				call = ToolCallIDFromRequestID(raw)
			}
		}
	}
	if call == "" && !idGiven {
		vs = append(vs, protocol.Violation{Field: "_meta." + MetaToolCallID, Code: protocol.VRequired, Message: "the request carries no id the call can be keyed by: give one"})
	}
	if v, ok := meta[MetaTimeoutMS]; ok {
		n, isNum := v.(float64)
		if !isNum || n != float64(int64(n)) || n < 1 || n > 86_400_000 {
			vs = append(vs, protocol.Violation{Field: "_meta." + MetaTimeoutMS, Code: protocol.VInvalidValue, Message: "must be an integer from 1 to 86400000"})
		} else {
			timeoutMS = int64(n)
		}
	}
	return turn, call, timeoutMS, vs
}

func (f *Front) callTool(ctx context.Context, ss *mcp.ServerSession, p *mcp.CallToolParamsRaw, closeStream func(mcp.CloseSSEStreamArgs)) (*mcp.CallToolResult, error) {
	turn, callID, timeoutMS, local := f.callIdentity(ss, p.Meta)
	args := bytes.TrimSpace(p.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = []byte("{}")
	}
	def, err := f.tool(ctx, p.Name)
	if err != nil {
		return nil, ledgerError("tools/call", err)
	}
	if len(local) > 0 {
		// No dispatch can carry this request as it was sent: refused here,
		// with every violation the front door can find itself, and not
		// recorded (docs/mcp.md#bad-input).
		if args[0] != '{' {
			local = append(local, protocol.Violation{Field: "arguments", Code: protocol.VInvalidType, Message: "must be a JSON object"})
		}
		if def == nil {
			local = append(local, protocol.Violation{Field: "name", Code: protocol.VNotFound, Message: fmt.Sprintf("project %s has no tool %q (tools/list lists them)", f.cfg.Project, p.Name)})
		}
		return nil, invalidParams(fmt.Sprintf("tools/call %q refused", p.Name), local)
	}
	if def == nil {
		// Dispatched as asked, to the subject a tool of that name would
		// have: the ledger's checks.registered refuses it, on record.
		def = &protocol.ToolDefinition{ToolName: p.Name, TargetSubject: protocol.ToolCommandSubject(protocol.DefaultVersion, f.cfg.Project, f.cfg.Channel, p.Name)}
	}

	cardID, traceID, spanID := cardIDs(f.cfg.Project, turn, callID)
	content, err := json.Marshal(struct {
		ToolName  string          `json:"tool_name"`
		Arguments json.RawMessage `json:"arguments"`
	}{def.ToolName, args})
	if err != nil {
		return nil, invalidParams("tools/call arguments do not encode", []protocol.Violation{{Field: "arguments", Code: protocol.VInvalidJSON, Message: err.Error()}})
	}
	if len(content) > MaxArgumentsBytes {
		// A dispatch this large is over the ledger's request limit, and
		// may be over what NATS carries to it: refused here, not recorded.
		return nil, invalidParams(fmt.Sprintf("tools/call %q refused", p.Name), []protocol.Violation{{Field: "arguments", Code: protocol.VTooLarge,
			Message: fmt.Sprintf("is %d bytes as the tool.call card's content; the ledger's request limit is %d (a card: %d)", len(content), protocol.MaxRequestBytes, protocol.MaxCardBytes)}})
	}
	req := protocol.DispatchRequest{
		Subject: def.TargetFor(f.cfg.Project, f.cfg.Channel),
		Identity: protocol.Identity{AgentID: f.cfg.Agent, AgentTurnID: turn, TurnEpoch: TurnEpoch, ToolCallID: callID,
			Traceparent: "00-" + traceID + "-" + spanID + "-01"},
		Card: protocol.Card{CardID: cardID, ProjectID: f.cfg.Project, Type: protocol.CardToolCall, AuthorID: f.cfg.Agent,
			AgentTurnID: turn, ToolCallID: callID, Content: content,
			Metadata: protocol.CardMetadata{TraceID: traceID, ParentStepID: turn, StepID: "step-" + callID}},
		Payload: protocol.ToolCommandPayload{ToolCallCardID: cardID, ToolName: def.ToolName, AfterExecution: def.AfterExecution, TimeoutMS: timeoutMS},
		// The ledger refuses, and records the refusal of, a tool the
		// project does not have and arguments its schema refuses, so an
		// MCP client's bad call is on record like any worker's.
		Checks: &protocol.DispatchChecks{Registered: true, Arguments: true},
	}
	if req.Payload.AfterExecution == "" {
		req.Payload.AfterExecution = protocol.AfterSuspend
	}
	// Listening before the dispatch: the report's wakeup cannot come
	// before anyone hears it.
	wake, live, stopWatch := f.wake.watch(ctx, turn, callID)
	defer stopWatch()
	d, err := f.cfg.Ledger.Dispatch(ctx, req)
	if err != nil {
		if pe, ok := protocol.AsError(err); ok && (pe.Code == protocol.CodeBadRequest || pe.Code == protocol.CodeNotFound) {
			return nil, dispatchRefused(p.Name, turn, callID, pe)
		}
		return nil, ledgerError("tools/call dispatch", err)
	}
	f.log.Debug("mcp tools/call dispatched", "tool", def.ToolName, "agent_turn_id", turn, "tool_call_id", callID, "duplicate", d.Duplicate)
	// The call's story as it is written, for a client that asked for log
	// messages (logging/setLevel): the card, the command, the report.
	f.notify(ctx, ss, "tool.call card stored", map[string]any{"agent_turn_id": turn, "tool_call_id": callID, "tool": def.ToolName,
		"tool_call_card_id": d.ToolCallCardID, "card_seq": d.CardSeq, "duplicate": d.Duplicate})
	f.notify(ctx, ss, "tool command published", map[string]any{"subject": d.Subject, "command_seq": d.CommandSeq,
		"deadline_unix_ms": d.DeadlineUnixMS, "awaiting_approval": d.AwaitingApproval, "paused": d.Paused, "tool_unavailable": d.ToolUnavailable})
	rec, err := f.wait(ctx, ss, p, def.ToolName, turn, callID, d, closeStream, wake, live)
	if err != nil {
		return nil, err
	}
	f.notify(ctx, ss, "report stored", map[string]any{"status": rec.Claim.Status, "report_seq": rec.Claim.Seq,
		"tool_result_card_id": rec.Claim.ToolResultCardID, "source_id": rec.Claim.SourceID})
	return f.answer(ctx, rec, d.Duplicate)
}

// dispatchRefused is the ledger's refusal of a tools/call's dispatch
// (recorded, at pe.Seq) as invalid params: every violation, each field
// named as the MCP request names it (name, arguments.<member>,
// _meta.cgledger/…) with the dispatch's own field in its message, one
// violation per field for those the dispatch repeats (an id is in a header
// and in the card).
func dispatchRefused(name, turn, callID string, pe *protocol.Error) error {
	vs := make([]protocol.Violation, 0, len(pe.Violations))
	seen := map[string]bool{}
	for _, v := range pe.Violations {
		field, mapped := mcpField(v.Field)
		if v.Code == protocol.VTooLarge && (v.Field == "body" || v.Field == "card") {
			// The arguments are what makes a dispatch (or its card) large.
			field, mapped = "arguments", true
		}
		if mapped && !strings.HasPrefix(field, "arguments") {
			if seen[field] {
				continue
			}
			seen[field] = true
		}
		if mapped {
			v.Message += " (" + v.Field + " of the dispatch)"
		}
		v.Field = field
		vs = append(vs, v)
	}
	msg := fmt.Sprintf("tools/call %q refused: %s: %s", name, pe.Code, pe.Message)
	data, _ := json.Marshal(map[string]any{"code": pe.Code, "message": pe.Message, "violations": vs, "rejection_seq": pe.Seq,
		"agent_turn_id": turn, "tool_call_id": callID})
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg, Data: data}
}

// mcpField is the tools/call field a dispatch field comes from, and
// whether it is one.
func mcpField(f string) (string, bool) {
	switch {
	case f == "subject" || f == "payload.tool_name" || f == "card.content.tool_name":
		return "name", true
	case f == "card.content.arguments" || strings.HasPrefix(f, "card.content.arguments."):
		return "arguments" + strings.TrimPrefix(f, "card.content.arguments"), true
	case f == "header."+protocol.HeaderAgentTurnID || f == "card.agent_turn_id" || f == "card.metadata.parent_step_id":
		return "_meta." + MetaAgentTurnID, true
	case f == "header."+protocol.HeaderToolCallID || f == "card.tool_call_id" || f == "card.metadata.step_id":
		return "_meta." + MetaToolCallID, true
	case f == "payload.timeout_ms":
		return "_meta." + MetaTimeoutMS, true
	}
	return f, false
}

// notify sends one log message of the call's story (level info, logger
// "cgledger"); the SDK drops it unless the client set a level.
func (f *Front) notify(ctx context.Context, ss *mcp.ServerSession, what string, data map[string]any) {
	data["event"] = what
	if err := ss.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Logger: "cgledger", Data: data}); err != nil {
		f.log.Debug("mcp log message not sent", "err", err)
	}
}

// wait reads the call when it dispatched, on each of its wakeups and on a
// poll (slow when live, the wakeups heard; else fast) until its report is
// stored, telling the client of progress when it asked, and cancels the
// call when the client cancels the request (never when the connection only
// goes away: the call then runs to its outcome, which the same request
// answers later).
func (f *Front) wait(ctx context.Context, ss *mcp.ServerSession, p *mcp.CallToolParamsRaw, tool, turn, callID string, d protocol.DispatchResult,
	closeStream func(mcp.CloseSSEStreamArgs), wake <-chan struct{}, live bool) (*protocol.CallRecord, error) {
	start := time.Now()
	var closeAfter <-chan time.Time
	if f.cfg.CloseStreamAfter > 0 && closeStream != nil {
		t := time.NewTimer(f.cfg.CloseStreamAfter)
		defer t.Stop()
		closeAfter = t.C
	}
	var limit time.Time
	if d.DeadlineUnixMS > 0 {
		limit = time.UnixMilli(d.DeadlineUnixMS).Add(ReportWaitGrace)
	}
	token := p.GetProgressToken()
	progress := time.NewTicker(f.cfg.ProgressInterval)
	defer progress.Stop()
	poll, maxPoll := PollFirst, PollMax
	if live {
		poll, maxPoll = FallbackPollFirst, FallbackPollMax
	}
	first := true
	timer := time.NewTimer(0)
	defer timer.Stop()
	var budget float64
	if d.DeadlineUnixMS > 0 {
		budget = float64(time.UnixMilli(d.DeadlineUnixMS).Sub(start).Milliseconds())
	}
	for {
		select {
		case <-ctx.Done():
			// The SDK cancels a request's context with no cause of its own
			// (context.Canceled) only for notifications/cancelled; a
			// closing connection gives its reason as the cause.
			if context.Cause(ctx) == context.Canceled {
				f.cancel(turn, callID)
			}
			return nil, ctx.Err()
		case <-closeAfter:
			closeStream(mcp.CloseSSEStreamArgs{RetryAfter: StreamRetryAfter})
		case <-progress.C:
			if token == nil {
				continue
			}
			elapsed := float64(time.Since(start).Milliseconds())
			msg := fmt.Sprintf("%s: waiting for the report of turn %s call %s", tool, turn, callID)
			if d.AwaitingApproval {
				msg = fmt.Sprintf("%s: held for an approver's decision (turn %s call %s)", tool, turn, callID)
			}
			pp := &mcp.ProgressNotificationParams{ProgressToken: token, Progress: elapsed, Message: msg}
			if budget > 0 && elapsed < budget {
				pp.Total = budget
			}
			if err := ss.NotifyProgress(ctx, pp); err != nil {
				f.log.Debug("mcp progress not sent", "err", err)
			}
		case <-wake:
			if rec := f.reported(ctx, turn, callID); rec != nil {
				return rec, nil
			}
		case <-timer.C:
			if rec := f.reported(ctx, turn, callID); rec != nil {
				if live && !first {
					// Found by a poll, not announced: a lost wakeup or a
					// roster that moved. The next call reads it again.
					f.wake.markStale()
				}
				return rec, nil
			}
			first = false
			if !limit.IsZero() && time.Now().After(limit) {
				data, _ := json.Marshal(map[string]any{"agent_turn_id": turn, "tool_call_id": callID, "deadline_unix_ms": d.DeadlineUnixMS})
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Data: data,
					Message: fmt.Sprintf("no report for turn %s call %s by its deadline plus %s; the same request asks again", turn, callID, ReportWaitGrace)}
			}
			timer.Reset(poll)
			poll = min(poll*2, maxPoll)
		}
	}
}

// reported reads the call: its record once its report is stored, nil
// before (a failed read is logged and counts as not yet).
func (f *Front) reported(ctx context.Context, turn, callID string) *protocol.CallRecord {
	rec, err := f.cfg.Ledger.GetCall(ctx, f.cfg.Project, turn, callID)
	if err != nil && ctx.Err() == nil {
		f.log.Warn("mcp tools/call: read call", "agent_turn_id", turn, "tool_call_id", callID, "err", err)
	}
	if err == nil && rec.Claim != nil && rec.Claim.ToolResultCardID != "" {
		return rec
	}
	return nil
}

// StreamRetryAfter is the reconnection delay a closed stream asks of the
// client (CloseStreamAfter).
const StreamRetryAfter = 500 * time.Millisecond

// cancel asks the ledger to cancel the call, as its agent: the client gave
// up on the request (notifications/cancelled).
func (f *Front) cancel(turn, callID string) {
	ctx, done := context.WithTimeout(context.Background(), 10*time.Second)
	defer done()
	_, err := f.cfg.Ledger.Cancel(ctx, protocol.CancelRequest{ProjectID: f.cfg.Project, AgentID: f.cfg.Agent, AgentTurnID: turn, ToolCallID: callID,
		Reason: "mcp notifications/cancelled"})
	if err != nil {
		f.log.Warn("mcp cancel", "agent_turn_id", turn, "tool_call_id", callID, "err", err)
	}
}

// mcpResult is the shape of a result that is MCP content already (what a
// tool answering in MCP's terms writes): kept whole.
type mcpResult struct {
	Content           []json.RawMessage `json:"content"`
	StructuredContent json.RawMessage   `json:"structuredContent"`
}

// answer turns the call's report into the tools/call answer.
func (f *Front) answer(ctx context.Context, rec *protocol.CallRecord, duplicate bool) (*mcp.CallToolResult, error) {
	cards, _, err := f.cfg.Ledger.GetCards(ctx, f.cfg.Project, []string{rec.Claim.ToolResultCardID})
	if err != nil {
		return nil, ledgerError("tools/call: read the result card", err)
	}
	if len(cards) != 1 {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError,
			Message: fmt.Sprintf("the report of turn %s call %s names result card %s, which the ledger does not hold", rec.AgentTurnID, rec.ToolCallID, rec.Claim.ToolResultCardID)}
	}
	tr, err := cards[0].Card.ToolResult()
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "result card: " + err.Error()}
	}
	meta := mcp.Meta{
		MetaStatus: tr.Status, MetaReportSeq: rec.Claim.Seq, MetaResultCardID: rec.Claim.ToolResultCardID,
		MetaAgentTurnID: rec.AgentTurnID, MetaToolCallID: rec.ToolCallID,
	}
	if duplicate {
		meta[MetaDuplicate] = true
	}
	switch tr.Status {
	case protocol.StatusSuccess, protocol.StatusPartial:
		res, err := contentOf(tr.Result)
		if err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "result card content: " + err.Error()}
		}
		res.Meta = withTheirs(meta, res.Meta)
		return res, nil
	}
	// failed, timeout, canceled: a tool error the model can read, with the
	// taxonomy code first.
	te := tr.Error
	if te == nil {
		te = &protocol.ToolError{Code: tr.Status}
	}
	var detail struct {
		TaxonomyCode string               `json:"taxonomy_code"`
		Violations   []protocol.Violation `json:"violations"`
	}
	_ = json.Unmarshal(te.Detail, &detail)
	if te.Code == protocol.ErrorCodeBadRequest && len(detail.Violations) > 0 {
		// The tool refused the arguments (its schema): the refusal is on
		// record as the call's outcome, and the client is told of every
		// violation as bad parameters.
		pe := &protocol.Error{Code: protocol.CodeBadRequest, Message: te.Message, Violations: detail.Violations}
		data, _ := json.Marshal(map[string]any{"code": pe.Code, "message": pe.Message, "violations": pe.Violations,
			"agent_turn_id": rec.AgentTurnID, "tool_call_id": rec.ToolCallID, "report_seq": rec.Claim.Seq})
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: pe.Error(), Data: data}
	}
	code := detail.TaxonomyCode
	if code == "" {
		code = te.Code
	}
	msg := te.Message
	if tr.Status == protocol.StatusCanceled {
		// Whoever canceled (the agent, an MCP client's notifications/cancelled,
		// an admin) is on the cancel entry, not in the result card, whose
		// message is the tool service's guess.
		msg = fmt.Sprintf("the call was canceled (its cancel entry, in cgledger audit turn %s, names who canceled it)", rec.AgentTurnID)
	}
	text := code + ": " + msg
	if msg == "" {
		text = code + ": the call ended " + tr.Status
	}
	structured := map[string]any{"status": tr.Status, "code": te.Code, "taxonomy_code": code, "message": msg,
		"agent_turn_id": rec.AgentTurnID, "tool_call_id": rec.ToolCallID}
	if len(te.Detail) > 0 {
		structured["detail"] = te.Detail
	}
	res := &mcp.CallToolResult{IsError: true, Meta: meta, StructuredContent: structured}
	// A tool answering in MCP's terms may have said more than the code
	// (its own error content): kept after the code's line.
	if inner, err := contentOf(tr.Result); err == nil && isMCP(tr.Result) {
		res.Content = inner.Content
		res.Meta = withTheirs(meta, inner.Meta)
	}
	res.Content = append([]mcp.Content{&mcp.TextContent{Text: text}}, res.Content...)
	return res, nil
}

// withTheirs is the answer's _meta: the result's own _meta (what the MCP
// server behind a bridged tool answered) with the front door's cgledger/
// keys over it, so a tool cannot pass off another status or report.
func withTheirs(ours, theirs mcp.Meta) mcp.Meta {
	if len(theirs) == 0 {
		return ours
	}
	out := make(mcp.Meta, len(theirs)+len(ours))
	for k, v := range theirs {
		if !strings.HasPrefix(k, "cgledger/") {
			out[k] = v
		}
	}
	for k, v := range ours {
		out[k] = v
	}
	return out
}

// MaxArgumentsBytes bounds a tools/call's arguments as the tool.call card's
// content: the ledger's request limit (the card's own, 512 KiB, is the
// ledger's to refuse, on record).
const MaxArgumentsBytes = protocol.MaxRequestBytes

// isMCP reports whether a result is MCP content already: an object with a
// "content" array.
func isMCP(raw json.RawMessage) bool {
	var r mcpResult
	return json.Unmarshal(raw, &r) == nil && r.Content != nil
}

// contentOf is a result as MCP content: MCP content kept whole (every item,
// structuredContent), any other JSON as one text item of its JSON, and an
// object also as structuredContent.
func contentOf(raw json.RawMessage) (*mcp.CallToolResult, error) {
	if isMCP(raw) {
		var res mcp.CallToolResult
		if err := json.Unmarshal(inlineResult(raw), &res); err != nil {
			return nil, err
		}
		res.IsError = false
		return &res, nil
	}
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(raw)}}}
	if bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")) {
		res.StructuredContent = raw
	}
	return res, nil
}

// requestIDMeta is the _meta value the transports write for a request id.
func requestIDMeta(id jsonrpc.ID) (any, bool) {
	switch v := id.Raw().(type) {
	case string:
		return v, true
	case int64:
		return v, true
	}
	return nil, false
}
