package projector

import (
	"encoding/json"
	"fmt"

	"github.com/cgledger/cgledger/protocol"
)

// heldPaused applies a held entry of reason paused: a call whose tool was
// paused when its command would have been published. A call never held
// before is recorded in state paused and listed from its held time (as a
// call held for approval is); an approved call held for approval moves to
// paused. Its command (a resume's release) moves it to dispatched, its
// report (its deadline passed while paused) to reported, as for any call.
// A call that has its command already, or a second such entry, is only
// placed in the timeline.
func (a *applier) heldPaused(ev event, h protocol.HeldEntry, st *CallState) error {
	if st != nil && (st.DispatchedSeq != 0 || st.PausedSeq != 0 || st.ReportedSeq != 0) {
		a.trace(ev, h.ProjectID, h.AgentTurnID, h.ToolCallID)
		return nil
	}
	if st == nil || st.HeldSeq == 0 {
		prev := st
		st = &CallState{ProjectID: h.ProjectID, AgentTurnID: h.AgentTurnID, ToolCallID: h.ToolCallID}
		if prev != nil {
			st.Rejections, st.LastRejection, st.RejectedSeq = prev.Rejections, prev.LastRejection, prev.RejectedSeq
		}
		t := ev.t
		st.ChannelID, st.AgentID, st.TurnEpoch, st.StepID = h.ChannelID, h.AgentID, h.TurnEpoch, h.StepID
		st.ToolName, st.Subject, st.ToolCallCardID = h.ToolName, h.CommandSubject, h.ToolCallCardID
		st.HeldSeq, st.HeldAt = ev.seq, &t
		a.index(st, dimAll, "")
		a.index(st, dimTool, st.ToolName)
		a.index(st, dimAgent, st.AgentID)
		a.index(st, dimChannel, st.ChannelID)
	}
	st.State, st.PausedSeq = StatePaused, ev.seq
	a.index(st, dimState, StatePaused)
	a.saveState(st, ev.seq)
	a.trace(ev, h.ProjectID, h.AgentTurnID, h.ToolCallID)
	return nil
}

// toolPause applies a tool_pause entry: the tool's pause state from here
// (a tp row per pause and resume).
func (a *applier) toolPause(ev event) error {
	var e protocol.ToolPauseEntry
	if err := decode(ev, &e); err != nil {
		return err
	}
	sub, err := protocol.ParseSubject(ev.subject)
	if err != nil || !protocol.ValidIdentifier(e.ProjectID) || !protocol.ValidIdentifier(e.ToolName) || sub.Project != e.ProjectID || sub.Tool != e.ToolName {
		return corrupt(ev.seq, "tool_pause entry without valid project_id/tool_name matching its subject")
	}
	a.set(key(tagToolPause, e.ProjectID, e.ToolName).u64(ev.seq), ev.data)
	return nil
}

// ToolPauseState is a tool's pause state as of a query: the last pause or
// resume of it.
type ToolPauseState struct {
	Seq    uint64 `json:"seq"`
	Paused bool   `json:"paused"`
	Actor  string `json:"actor"`
	Reason string `json:"reason"`
}

// toolPauseAt reads a tool's last pause or resume at or before seq (nil
// when it was never paused).
func toolPauseAt(r reader, project, tool string, seq uint64) (*ToolPauseState, error) {
	var out *ToolPauseState
	err := scan(r, key(tagToolPause, project, tool).prefix(), nil, func(k, val []byte) (bool, error) {
		s := trailingU64(k)
		if s > seq {
			return false, nil
		}
		var e protocol.ToolPauseEntry
		if err := json.Unmarshal(val, &e); err != nil {
			return false, fmt.Errorf("decode tool_pause %d: %w", s, err)
		}
		out = &ToolPauseState{Seq: s, Paused: e.Paused, Actor: e.Actor, Reason: e.Reason}
		return true, nil
	})
	return out, err
}
