package ledger

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go"
)

// SetRoster records agent_id -> worker_target for a project. Wakeups for the
// agent's calls go to the worker target current when the report is accepted.
// A request that is not certainly valid is read through the API's parser,
// so its violations and its rejection entry are exactly a remote one's.
func (l *Ledger) SetRoster(ctx context.Context, e protocol.RosterEntry) (protocol.RosterResult, error) {
	by := callerOf(ctx)
	ident := protocol.ValidIdentifier
	if !ident(e.ProjectID) || !ident(e.AgentID) || !ident(e.WorkerTarget) {
		return viaWire(ctx, protocol.OpRosterSet, e, func(ctx context.Context, body []byte) (protocol.RosterResult, error) {
			return l.setRosterJSON(ctx, by, body)
		})
	}
	data, err := json.Marshal(e)
	if err != nil {
		return protocol.RosterResult{}, fmt.Errorf("set roster: encode: %w", err)
	}
	return l.setRoster(ctx, by, e, data)
}

// setRosterJSON parses a roster.set as received over the API, once, for
// the core (setRoster).
func (l *Ledger) setRosterJSON(ctx context.Context, by *protocol.Caller, body []byte) (protocol.RosterResult, error) {
	e, vs := protocol.ParseRosterEntry(body)
	if err := protocol.BadRequest("roster entry", vs); err != nil {
		ee, _ := protocol.AsError(err)
		return protocol.RosterResult{}, l.reject(ctx, by, protocol.OpRosterSet, e.ProjectID, protocol.Unrouted, ee, protocol.NewRejectedRequest("", nil, body))
	}
	data, err := json.Marshal(e)
	if err != nil {
		return protocol.RosterResult{}, fmt.Errorf("set roster: encode: %w", err)
	}
	return l.setRoster(ctx, by, e, data)
}

// setRoster is the one core of roster.set, typed or received: e is valid,
// data its encoding (the entry stored).
func (l *Ledger) setRoster(ctx context.Context, by *protocol.Caller, e protocol.RosterEntry, data []byte) (protocol.RosterResult, error) {
	msg := &nats.Msg{Subject: protocol.RosterSubject(l.version, e.ProjectID, e.AgentID), Data: data, Header: nats.Header{}}
	msg.Header.Set(protocol.HeaderProjectID, e.ProjectID)
	msg.Header.Set(protocol.HeaderAgentID, e.AgentID)
	ack, err := l.appendEntry(ctx, by, protocol.KindRoster, msg)
	// Read-your-writes in this process, whatever the watch's delay.
	l.cache.changed(msg.Subject)
	if err != nil {
		return protocol.RosterResult{}, fmt.Errorf("set roster %s/%s: %w", e.ProjectID, e.AgentID, err)
	}
	return protocol.RosterResult{RosterEntry: e, Seq: ack.Sequence}, nil
}

// GetRoster returns an agent's current roster entry, or an error matching
// ErrNotFound when the agent has none.
func (l *Ledger) GetRoster(ctx context.Context, project, agentID string) (protocol.RosterResult, error) {
	var vs protocol.Violations
	protocol.CheckIdent(&vs, "project_id", project, true)
	protocol.CheckIdent(&vs, "agent_id", agentID, true)
	if err := protocol.BadRequest("roster lookup", vs); err != nil {
		return protocol.RosterResult{}, err
	}
	msg, err := l.lastForSubject(ctx, protocol.RosterSubject(l.version, project, agentID))
	if err != nil {
		return protocol.RosterResult{}, fmt.Errorf("get roster %s/%s: %w", project, agentID, err)
	}
	if msg == nil {
		return protocol.RosterResult{}, protocol.NewError(protocol.CodeNotFound, nil, "agent %s has no roster entry in project %s", agentID, project)
	}
	var r protocol.RosterResult
	if err := json.Unmarshal(msg.Data, &r.RosterEntry); err != nil {
		return protocol.RosterResult{}, fmt.Errorf("get roster %s/%s: decode entry %d: %w", project, agentID, msg.Sequence, err)
	}
	r.Seq = msg.Sequence
	return r, nil
}
