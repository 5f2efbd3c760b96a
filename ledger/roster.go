package ledger

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
)

// RosterResult is an agent's roster entry and the sequence that wrote it.
type RosterResult struct {
	RosterEntry
	Seq uint64 `json:"seq"`
}

// SetRoster records agent_id -> worker_target for a project. Wakeups for the
// agent's calls go to the worker target current when the report is accepted.
func (l *Ledger) SetRoster(ctx context.Context, e RosterEntry) (RosterResult, error) {
	var vs Violations
	checkIdent(&vs, "project_id", e.ProjectID, true)
	checkIdent(&vs, "agent_id", e.AgentID, true)
	checkIdent(&vs, "worker_target", e.WorkerTarget, true)
	data, err := json.Marshal(e)
	if err != nil {
		return RosterResult{}, fmt.Errorf("set roster: encode: %w", err)
	}
	if err := badRequest("roster entry", vs); err != nil {
		ee, _ := AsError(err)
		return RosterResult{}, l.reject(ctx, OpRosterSet, e.ProjectID, Unrouted, ee, rejectedRequest("", nil, data))
	}
	return l.setRoster(ctx, e, data)
}

// SetRosterJSON is SetRoster for a JSON body, as received over the API.
func (l *Ledger) SetRosterJSON(ctx context.Context, body []byte) (RosterResult, error) {
	var vs Violations
	var e RosterEntry
	if o, ok := parseObject("body", body, &vs); ok {
		e = RosterEntry{ProjectID: o.ident("project_id", true), AgentID: o.ident("agent_id", true), WorkerTarget: o.ident("worker_target", true)}
	}
	if err := badRequest("roster entry", vs); err != nil {
		ee, _ := AsError(err)
		return RosterResult{}, l.reject(ctx, OpRosterSet, e.ProjectID, Unrouted, ee, rejectedRequest("", nil, body))
	}
	data, err := json.Marshal(e)
	if err != nil {
		return RosterResult{}, fmt.Errorf("set roster: encode: %w", err)
	}
	return l.setRoster(ctx, e, data)
}

func (l *Ledger) setRoster(ctx context.Context, e RosterEntry, data []byte) (RosterResult, error) {
	msg := &nats.Msg{Subject: RosterSubject(l.version, e.ProjectID, e.AgentID), Data: data, Header: nats.Header{}}
	msg.Header.Set(HeaderProjectID, e.ProjectID)
	msg.Header.Set(HeaderAgentID, e.AgentID)
	ack, err := l.appendEntry(ctx, KindRoster, msg)
	// Read-your-writes in this process, whatever the watch's delay.
	l.cache.changed(msg.Subject)
	if err != nil {
		return RosterResult{}, fmt.Errorf("set roster %s/%s: %w", e.ProjectID, e.AgentID, err)
	}
	return RosterResult{RosterEntry: e, Seq: ack.Sequence}, nil
}

// GetRoster returns an agent's current roster entry, or an error matching
// ErrNotFound when the agent has none.
func (l *Ledger) GetRoster(ctx context.Context, project, agentID string) (RosterResult, error) {
	var vs Violations
	checkIdent(&vs, "project_id", project, true)
	checkIdent(&vs, "agent_id", agentID, true)
	if err := badRequest("roster lookup", vs); err != nil {
		return RosterResult{}, err
	}
	msg, err := l.lastForSubject(ctx, RosterSubject(l.version, project, agentID))
	if err != nil {
		return RosterResult{}, fmt.Errorf("get roster %s/%s: %w", project, agentID, err)
	}
	if msg == nil {
		return RosterResult{}, newError(CodeNotFound, nil, "agent %s has no roster entry in project %s", agentID, project)
	}
	var r RosterResult
	if err := json.Unmarshal(msg.Data, &r.RosterEntry); err != nil {
		return RosterResult{}, fmt.Errorf("get roster %s/%s: decode entry %d: %w", project, agentID, msg.Sequence, err)
	}
	r.Seq = msg.Sequence
	return r, nil
}
