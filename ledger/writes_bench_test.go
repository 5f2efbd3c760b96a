package ledger_test

import (
	"fmt"
	"testing"

	"github.com/cgledger/cgledger/protocol"
)

// BenchmarkTypedWrites measures typed Go writes other than dispatch and
// report, each an append with its reads: an agent's cancel of a dispatched
// call (the dispatch is setup, out of the timer), and a tool's pause and
// resume, alternating (one op each).
func BenchmarkTypedWrites(b *testing.B) {
	e := newEnv(b)
	ctx := b.Context()
	const tool = "bench-tool"
	_, err := e.l.RegisterToolYAML(ctx, project, []byte(fmt.Sprintf(
		"tool_name: %s\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.%s\nafter_execution: suspend\n", tool, tool)))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cancel", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			b.StopTimer()
			c := newCall(fmt.Sprintf("turn-bc-%d-%d", b.N, i), "call-bc", 1)
			if _, err := e.l.Dispatch(ctx, c.dispatchReq()); err != nil {
				b.Fatalf("dispatch: %v", err)
			}
			b.StartTimer()
			if _, err := e.l.Cancel(ctx, protocol.CancelRequest{ProjectID: project, AgentID: agent, AgentTurnID: c.turn, ToolCallID: c.id, Reason: "bench"}); err != nil {
				b.Fatalf("cancel: %v", err)
			}
		}
	})
	b.Run("pause_resume", func(b *testing.B) {
		b.ReportAllocs()
		req := protocol.ToolPauseRequest{ProjectID: project, ToolName: tool, Reason: "bench"}
		for i := range b.N {
			op := e.l.PauseTool
			if i%2 == 1 {
				op = e.l.ResumeTool
			}
			if _, err := op(ctx, "ops-bench", req); err != nil {
				b.Fatalf("pause/resume %d: %v", i, err)
			}
		}
		if b.N%2 == 1 {
			if _, err := e.l.ResumeTool(ctx, "ops-bench", req); err != nil {
				b.Fatalf("resume: %v", err)
			}
		}
	})
}
