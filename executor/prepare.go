package executor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/cgledger/cgledger/protocol"
)

// prepare resolves the tool definition and final arguments. A non-nil
// *Outcome is the call's answer (it cannot run); an error is transient.
func (e *Executor) prepare(im *impl, cmd *protocol.ToolCommand, pre *prefetched) (*Call, *jsonschema.Schema, []string, *Outcome, error) {
	ctx, cancel := e.opCtx()
	defer cancel()
	sub, id := cmd.Subject, cmd.Identity
	card, err := pre.card, pre.cardErr
	if errors.Is(err, protocol.ErrUnknownCard) {
		o := Invalid("the tool.call card does not exist", protocol.Violation{Field: "payload.tool_call_card_id", Code: protocol.VNotFound, Message: "card " + cmd.Payload.ToolCallCardID + " not found"})
		return nil, nil, nil, &o, nil
	}
	if err != nil {
		return nil, nil, nil, nil, err
	}
	tc, err := card.Card.ToolCall()
	if err != nil || card.Card.AgentTurnID != id.AgentTurnID || card.Card.ToolCallID != id.ToolCallID {
		o := Invalid("tool_call_card_id does not name this call's tool.call card", protocol.Violation{Field: "payload.tool_call_card_id", Code: protocol.VMismatch, Message: fmt.Sprintf("card %s is not the tool.call card of %s/%s", card.Card.CardID, id.AgentTurnID, id.ToolCallID)})
		return nil, nil, nil, &o, nil
	}
	toolName := cmd.Payload.ToolName
	if toolName == "" {
		toolName = tc.ToolName
	}
	def, seq, err := e.definition(ctx, im, sub.Project, toolName, pre)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	call := &Call{ProjectID: sub.Project, ChannelID: sub.Channel, AgentID: id.AgentID, AgentTurnID: id.AgentTurnID, TurnEpoch: id.TurnEpoch,
		ToolCallID: id.ToolCallID, StepID: cmp.Or(id.StepID, card.Card.Metadata.StepID), ContextBoxID: id.ContextBoxID, ToolName: toolName,
		IdempotencyKey: protocol.IdempotencyKey(sub.Project, id.AgentTurnID, id.ToolCallID)}
	if def == nil {
		o := Terminal(CodeUnknownTool, fmt.Sprintf("tool %s is not registered in project %s", toolName, sub.Project), "register the tool (POST /projects/"+sub.Project+"/tools)")
		return call, nil, nil, &o, nil
	}
	call.Definition = def
	if target := def.TargetFor(sub.Project, sub.Channel); target != sub.String() {
		o := Terminal("C-CONTRACT-002", fmt.Sprintf("command subject %s is not tool %s's target %s", sub.String(), toolName, target), "publish the command on the tool's target_subject")
		return call, nil, nil, &o, nil
	}
	opts, err := def.ParsedOptions()
	if err != nil {
		o := Terminal(CodeToolConfig, err.Error(), "fix the tool registration")
		return call, nil, nil, &o, nil
	}
	call.Options = opts
	args, secrets, bad := resolveArgs(call, tc.Arguments, opts, card.Card.Metadata, e.lookupEnv)
	if bad != nil {
		return call, nil, secrets, bad, nil
	}
	call.Arguments = args
	schema, err := e.schema(sub.Project, def, seq)
	if err != nil {
		o := Terminal(CodeToolConfig, "the tool's parameters schema does not compile: "+err.Error(), "fix the tool registration")
		return call, nil, secrets, &o, nil
	}
	if call.resultSchema, err = e.resultSchema(sub.Project, def, seq); err != nil {
		o := Terminal(CodeToolConfig, "the tool's result_schema does not compile: "+err.Error(), "fix the tool registration")
		return call, nil, secrets, &o, nil
	}
	return call, schema, secrets, nil, nil
}

// definition reads the tool's registered definition (read-your-writes from
// the ledger), falling back to the implementation's built-in one.
func (e *Executor) definition(ctx context.Context, im *impl, project, toolName string, pre *prefetched) (*protocol.ToolDefinition, uint64, error) {
	if protocol.ValidIdentifier(toolName) {
		st, err := pre.tool, pre.toolErr
		if toolName != pre.toolName {
			st, err = e.l.GetTool(ctx, project, toolName)
		}
		if err == nil {
			// Registered: a name of its own in the metrics, also where
			// this executor runs apart from the ledger.
			e.labels.Add(toolName)
			e.labels.AddVersion(toolName, st.Definition.Version)
			return &st.Definition, st.Seq, nil
		}
		if !errors.Is(err, protocol.ErrNotFound) {
			return nil, 0, err
		}
	}
	if im.builtin != nil && toolName == im.builtin.ToolName {
		d := *im.builtin
		d.ProjectID = project
		return &d, 0, nil
	}
	return nil, 0, nil
}

func (e *Executor) schema(project string, def *protocol.ToolDefinition, seq uint64) (*jsonschema.Schema, error) {
	key := project + "\x00" + def.ToolName
	if s, ok := e.schemas.Get(key, seq); ok {
		return s, nil
	}
	s, err := def.CompileSchema()
	if err != nil {
		return nil, err
	}
	e.schemas.Put(key, seq, s)
	return s, nil
}

// resultSchema is schema for the definition's result_schema, cached apart
// from its parameters.
func (e *Executor) resultSchema(project string, def *protocol.ToolDefinition, seq uint64) (*jsonschema.Schema, error) {
	if len(def.ResultSchema) == 0 {
		return nil, nil
	}
	key := project + "\x00" + def.ToolName + "\x00result"
	if s, ok := e.schemas.Get(key, seq); ok {
		return s, nil
	}
	s, err := def.CompileResultSchema()
	if err != nil {
		return nil, err
	}
	e.schemas.Put(key, seq, s)
	return s, nil
}

// checkResult holds a successful (or partial) outcome to the tool's
// result_schema: a result that does not match is the call's failure,
// C-CONTRACT-RESULT with every violation, and error.detail.result keeps
// what the tool returned.
func checkResult(call *Call, o Outcome) Outcome {
	if call == nil || call.resultSchema == nil || (o.Kind != KindSuccess && o.Kind != KindPartial) {
		return o
	}
	vs := validateValue(call.resultSchema, o.Output, "result")
	if len(vs) == 0 {
		return o
	}
	version := ""
	if call.Definition != nil && call.Definition.Version != "" {
		version = " version " + call.Definition.Version
	}
	return Outcome{Kind: KindTerminal, Code: protocol.CodeResultContract, Output: o.Output, Violations: vs,
		Message: fmt.Sprintf("the result of tool %s%s does not match its result_schema: %d violation(s)", call.ToolName, version, len(vs)),
		Hint:    "fix the tool to return what its result_schema describes, or register a result_schema that matches"}
}

func (e *Executor) lookupEnv(name string) (string, bool) {
	if v, ok := e.cfg.EnvOverrides[name]; ok {
		return v, true
	}
	return e.cfg.LookupEnv(name)
}

// deadline is the call's deadline and budget: the one fixed at dispatch
// (the command's, else the record's), so every delivery runs only until
// then. A command of an earlier version, with neither, counts the tool's
// budget from now.
func (e *Executor) deadline(def *protocol.ToolDefinition, cmd *protocol.ToolCommand, rec *protocol.CallRecord) (time.Time, time.Duration) {
	ms := cmp.Or(cmd.Payload.DeadlineUnixMS, rec.DeadlineUnixMS)
	if ms > 0 {
		at := time.UnixMilli(ms)
		budget := protocol.CallTimeout(def, cmd.Payload.TimeoutMS)
		if !rec.DispatchedAt.IsZero() {
			budget = at.Sub(rec.DispatchedAt)
		}
		return at, budget
	}
	budget := protocol.CallTimeout(def, cmd.Payload.TimeoutMS)
	return time.Now().Add(budget), budget
}
