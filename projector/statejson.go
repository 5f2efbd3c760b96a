package projector

import (
	"strconv"
	"time"

	"github.com/cgledger/cgledger/internal/jsonenc"
)

// marshalCallState is json.Marshal(st), byte for byte: every call-state
// version the projector writes (one per entry of a call, in every rebuild)
// is stored as that JSON (docs/views.md), and encoding/json's reflection was
// a sixth of the cost of applying an entry. statejson_test.go checks the two
// agree field by field, so a field added to CallState fails it until it is
// added here too.
func marshalCallState(st *CallState) ([]byte, error) {
	b := make([]byte, 0, 512)
	w := jsonWriter{b: b}
	w.b = append(w.b, '{')
	w.str("project_id", st.ProjectID, false)
	w.str("channel_id", st.ChannelID, true)
	w.str("agent_id", st.AgentID, true)
	w.str("agent_turn_id", st.AgentTurnID, false)
	w.str("tool_call_id", st.ToolCallID, false)
	w.uint("turn_epoch", st.TurnEpoch, false)
	w.str("step_id", st.StepID, true)
	w.str("tool_name", st.ToolName, true)
	w.str("subject", st.Subject, true)
	w.str("tool_call_card_id", st.ToolCallCardID, true)
	w.str("state", st.State, false)
	w.uint("dispatched_seq", st.DispatchedSeq, true)
	w.time("dispatched_at", st.DispatchedAt)
	w.uint("reported_seq", st.ReportedSeq, true)
	w.time("reported_at", st.ReportedAt)
	w.str("status", st.Status, true)
	w.str("tool_result_card_id", st.ToolResultCardID, true)
	w.str("after_execution", st.AfterExecution, true)
	w.str("effective_after_execution", st.EffectiveAfterExecution, true)
	w.str("source_id", st.SourceID, true)
	w.uint("wakeup_seq", st.WakeupSeq, true)
	w.str("worker_target", st.WorkerTarget, true)
	if st.WakeupSkipped {
		w.key("wakeup_skipped")
		w.b = append(w.b, "true"...)
	}
	w.uint("consumed_seq", st.ConsumedSeq, true)
	w.time("consumed_at", st.ConsumedAt)
	w.uint("cancel_requested_seq", st.CancelRequestedSeq, true)
	w.uint("rejected_seq", st.RejectedSeq, true)
	w.str("last_rejection", st.LastRejection, true)
	w.key("rejections")
	w.b = strconv.AppendInt(w.b, int64(st.Rejections), 10)
	w.key("duplicates")
	w.b = strconv.AppendInt(w.b, int64(st.Duplicates), 10)
	w.uint("attempt", st.Attempt, true)
	w.uint("attempt_seq", st.AttemptSeq, true)
	w.str("outcome", st.Outcome, true)
	w.uint("held_seq", st.HeldSeq, true)
	w.time("held_at", st.HeldAt)
	w.str("approval", st.Approval, true)
	w.uint("approval_seq", st.ApprovalSeq, true)
	w.uint("paused_seq", st.PausedSeq, true)
	w.str("resolution", st.Resolution, true)
	w.uint("resolution_seq", st.ResolutionSeq, true)
	w.str("redrive_call_id", st.RedriveCallID, true)
	w.uint("redrive_seq", st.RedriveSeq, true)
	w.uint("updated_seq", st.UpdatedSeq, false)
	if w.err != nil {
		return nil, w.err
	}
	return append(w.b, '}'), nil
}

// jsonWriter appends the members of one JSON object as encoding/json
// writes them; err keeps the first value it could not write.
type jsonWriter struct {
	b     []byte
	wrote bool
	err   error
}

func (w *jsonWriter) key(k string) {
	if w.wrote {
		w.b = append(w.b, ',')
	}
	w.wrote = true
	w.b = append(w.b, '"')
	w.b = append(w.b, k...)
	w.b = append(w.b, '"', ':')
}

func (w *jsonWriter) str(k, v string, omitEmpty bool) {
	if omitEmpty && v == "" {
		return
	}
	w.key(k)
	w.b = jsonenc.AppendString(w.b, v)
}

func (w *jsonWriter) uint(k string, v uint64, omitEmpty bool) {
	if omitEmpty && v == 0 {
		return
	}
	w.key(k)
	w.b = strconv.AppendUint(w.b, v, 10)
}

// time writes a *time.Time member with omitempty (nil is left out). Entry
// times are UTC within years 0..9999, which is formatted here; any other
// goes through time.Time's MarshalJSON, with its refusals.
func (w *jsonWriter) time(k string, t *time.Time) {
	if t == nil {
		return
	}
	w.key(k)
	if y := t.Year(); t.Location() != time.UTC || y < 0 || y > 9999 {
		v, err := t.MarshalJSON()
		if err != nil && w.err == nil {
			w.err = err
		}
		w.b = append(w.b, v...)
		return
	}
	w.b = append(w.b, '"')
	w.b = t.AppendFormat(w.b, time.RFC3339Nano)
	w.b = append(w.b, '"')
}
