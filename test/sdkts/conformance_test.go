package sdkts

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/cgledger/cgledger/test/confrun"
)

// The cases every conforming tool passes, whatever it can produce.
var everyTool = []string{
	"normal", "status_success", "metadata_verbatim", "traceparent_child", "after_execution_kept",
	"command_missing_call_id", "command_inline_args", "command_unknown_card", "command_identity_mismatch",
	"redelivery_after_report", "duplicate_command", "canceled_call",
}

// TestConformanceExampleToolService runs `cgledger conformance` as CI does against the SDK's
// example tool service (examples/tool-service.mjs), once per tool it serves, each with the
// fixture beside its definition: greet (success, failed) and wait (every status a tool makes on
// its own, and the long call of the running-call cases). Serve keeps its tool consumers at a 1 s
// ack wait so that the heartbeat case applies to a 2.5 s call. Every case that applies passes;
// canceled status (no tool ends canceled on its own) and the side_effectful cases (both tools
// are pure) do not apply.
func TestConformanceExampleToolService(t *testing.T) {
	n := needNode(t)
	bin := binary(t)
	dir := sdkDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n.install(t, ctx, bin)
	n.run(t, ctx, bin, "run", "build")

	s := confrun.StartServe(t, bin, "--roles", "api,projector", "--tool-ack-wait", "1s")
	examples := filepath.Join(dir, "examples")
	for _, c := range []struct {
		tool string
		pass []string
	}{
		{"greet", append([]string{"status_failed"}, everyTool...)},
		{"wait", append([]string{"status_failed", "status_timeout", "status_partial", "redelivery_before_report",
			"canceled_while_running", "deadline_timeout_once", "heartbeats_long_call"}, everyTool...)},
	} {
		t.Run(c.tool, func(t *testing.T) {
			s.CLI(t, "tools", "register", filepath.Join(examples, c.tool+".yaml"), "--project", "demo")
			creds := s.Creds(t, "demo", "tool", "--tool", c.tool)
			env := append(s.Env(), "CGLEDGER_TOOL="+c.tool, "CGLEDGER_CREDS="+creds, "CGLEDGER_PROJECT=demo")
			confrun.StartProc(t, dir, env, c.tool+": serving demo", n.node, filepath.Join(examples, "tool-service.mjs"))
			rep := s.Conformance(t, "demo", c.tool, filepath.Join(examples, c.tool+".conformance.yaml"))
			confrun.RequireApplies(t, rep, c.pass)
		})
	}
}
