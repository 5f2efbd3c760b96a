package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RegisterToolYAML validates and records a tool definition. Registering the
// same definition again writes nothing; a changed one is a new version
// entry. It is readable with GetTool as soon as this returns.
func (l *Ledger) RegisterToolYAML(ctx context.Context, project string, body []byte) (protocol.RegisterResult, error) {
	return l.registerToolYAML(ctx, callerOf(ctx), project, body)
}

// registerToolYAML is RegisterToolYAML for by, the caller registering.
func (l *Ledger) registerToolYAML(ctx context.Context, by *protocol.Caller, project string, body []byte) (protocol.RegisterResult, error) {
	d, err := protocol.ParseToolYAML(project, body)
	if err != nil {
		e, _ := protocol.AsError(err)
		return protocol.RegisterResult{}, l.reject(ctx, by, protocol.OpToolRegister, project, protocol.Unrouted, e, protocol.NewRejectedRequest("", nats.Header{protocol.HeaderProjectID: {project}}, body))
	}
	data, err := json.Marshal(d)
	if err != nil {
		return protocol.RegisterResult{}, fmt.Errorf("register tool: encode: %w", err)
	}
	return l.registerTool(ctx, by, d, data)
}

// registerToolMsg serves tool.register: RegisterToolYAML, with the
// request's CG-Project-Id header held to the rule of every project id a
// request names. One naming another project was refused before (forbidden,
// protocol.CheckCaller); one that is not an identifier names none and is a
// bad_request, listed with the definition's own violations.
func (l *Ledger) registerToolMsg(ctx context.Context, by *protocol.Caller, project string, h nats.Header, body []byte) (protocol.RegisterResult, error) {
	hp := protocol.HeaderGet(h, protocol.HeaderProjectID)
	if hp == "" || protocol.ValidIdentifier(hp) {
		return l.registerToolYAML(ctx, by, project, body)
	}
	var vs protocol.Violations
	vs.Add("header."+protocol.HeaderProjectID, protocol.VInvalidToken, "%q is not an identifier (when present it must be the request subject's project, %q)", protocol.Clip(hp), project)
	_, err := protocol.ParseToolYAML(project, body)
	if e, ok := protocol.AsError(err); ok {
		if e.Code == protocol.CodeForbidden {
			return protocol.RegisterResult{}, l.reject(ctx, by, protocol.OpToolRegister, project, protocol.Unrouted, e, protocol.NewRejectedRequest("", h, body))
		}
		vs = append(vs, e.Violations...)
	}
	e := protocol.NewError(protocol.CodeBadRequest, vs, "invalid tool definition: %d violation(s)", len(vs))
	return protocol.RegisterResult{}, l.reject(ctx, by, protocol.OpToolRegister, project, protocol.Unrouted, e, protocol.NewRejectedRequest("", h, body))
}

// RegisterTool validates and records a definition built in Go (see
// RegisterToolYAML); its zero limits, retry fields and determinism take
// their defaults first (ToolDefinition.WithDefaults).
func (l *Ledger) RegisterTool(ctx context.Context, d *protocol.ToolDefinition) (protocol.RegisterResult, error) {
	by := callerOf(ctx)
	d = d.WithDefaults()
	data, err := json.Marshal(d)
	if err != nil {
		return protocol.RegisterResult{}, fmt.Errorf("register tool: encode: %w", err)
	}
	if _, err := protocol.ParseToolJSON(d.ProjectID, data); err != nil {
		e, _ := protocol.AsError(err)
		return protocol.RegisterResult{}, l.reject(ctx, by, protocol.OpToolRegister, d.ProjectID, protocol.Unrouted, e, protocol.NewRejectedRequest("", nil, data))
	}
	return l.registerTool(ctx, by, d, data)
}

// registerTool writes a validated definition unless it is already in force.
func (l *Ledger) registerTool(ctx context.Context, by *protocol.Caller, d *protocol.ToolDefinition, data []byte) (protocol.RegisterResult, error) {
	subj := protocol.ToolSubject(l.version, d.ProjectID, d.ToolName)
	for range 8 {
		cur, err := l.lastForSubject(ctx, subj)
		if err != nil {
			return protocol.RegisterResult{}, fmt.Errorf("register tool %s: %w", d.ToolName, err)
		}
		var last uint64
		if cur != nil {
			if bytes.Equal(cur.Data, data) {
				return protocol.RegisterResult{ToolName: d.ToolName, Seq: cur.Sequence, Unchanged: true, Definition: *d}, nil
			}
			last = cur.Sequence
		}
		msg := &nats.Msg{Subject: subj, Data: data, Header: nats.Header{}}
		msg.Header.Set(protocol.HeaderProjectID, d.ProjectID)
		ack, err := l.appendEntry(ctx, by, protocol.KindTool, msg, jetstream.WithExpectLastSequencePerSubject(last))
		// Read-your-writes in this process, whatever the watch's delay.
		l.cache.changed(subj)
		l.labels.AddVersion(d.ToolName, d.Version)
		if isWrongLastSeq(err) {
			continue // a concurrent registration won; compare with it
		}
		if err != nil {
			return protocol.RegisterResult{}, fmt.Errorf("register tool %s: %w", d.ToolName, err)
		}
		return protocol.RegisterResult{ToolName: d.ToolName, Seq: ack.Sequence, Definition: *d}, nil
	}
	return protocol.RegisterResult{}, fmt.Errorf("register tool %s: too many concurrent registrations", d.ToolName)
}

// GetTool reads the definition in force, or an error matching ErrNotFound.
func (l *Ledger) GetTool(ctx context.Context, project, tool string) (*protocol.StoredTool, error) {
	var vs protocol.Violations
	protocol.CheckIdent(&vs, "project_id", project, true)
	protocol.CheckIdent(&vs, "tool_name", tool, true)
	if err := protocol.BadRequest("tool lookup", vs); err != nil {
		return nil, err
	}
	m, err := l.lastForSubject(ctx, protocol.ToolSubject(l.version, project, tool))
	if err != nil {
		return nil, fmt.Errorf("get tool %s: %w", tool, err)
	}
	if m == nil {
		return nil, protocol.NewError(protocol.CodeNotFound, nil, "tool %s is not registered in project %s", tool, project)
	}
	st := &protocol.StoredTool{Seq: m.Sequence}
	if err := json.Unmarshal(m.Data, &st.Definition); err != nil {
		return nil, fmt.Errorf("get tool %s: decode entry %d: %w", tool, m.Sequence, err)
	}
	return st, nil
}

// GetToolAt reads the definition the entry at seq wrote: the version a call
// pinned at dispatch (CallRecord.ToolDefSeq), whatever was registered
// since. An error matching ErrNotFound when seq holds no definition of the
// tool (or no longer exists in the stream).
func (l *Ledger) GetToolAt(ctx context.Context, project, tool string, seq uint64) (*protocol.StoredTool, error) {
	var vs protocol.Violations
	protocol.CheckIdent(&vs, "project_id", project, true)
	protocol.CheckIdent(&vs, "tool_name", tool, true)
	if seq == 0 {
		vs.Add("seq", protocol.VInvalidValue, "must be a positive sequence")
	}
	if err := protocol.BadRequest("tool lookup", vs); err != nil {
		return nil, err
	}
	subj := protocol.ToolSubject(l.version, project, tool)
	m, err := l.stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && m.Subject != subj) {
		return nil, protocol.NewError(protocol.CodeNotFound, nil, "entry %d holds no definition of tool %s in project %s", seq, tool, project)
	}
	if err != nil {
		return nil, fmt.Errorf("get tool %s at %d: %w", tool, seq, err)
	}
	st := &protocol.StoredTool{Seq: m.Sequence}
	if err := json.Unmarshal(m.Data, &st.Definition); err != nil {
		return nil, fmt.Errorf("get tool %s: decode entry %d: %w", tool, m.Sequence, err)
	}
	return st, nil
}

// ListTools reads every tool registered in a project, by name.
func (l *Ledger) ListTools(ctx context.Context, project string) ([]protocol.StoredTool, error) {
	var vs protocol.Violations
	protocol.CheckIdent(&vs, "project_id", project, true)
	if err := protocol.BadRequest("tool listing", vs); err != nil {
		return nil, err
	}
	info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(protocol.ToolSubject(l.version, project, "*")))
	if err != nil {
		return nil, fmt.Errorf("list tools: %w", err)
	}
	names := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		names = append(names, protocol.ToolEntryName(subj))
	}
	sort.Strings(names)
	out := make([]protocol.StoredTool, 0, len(names))
	for _, n := range names {
		st, err := l.GetTool(ctx, project, n)
		if err != nil {
			return nil, err
		}
		out = append(out, *st)
	}
	return out, nil
}
