package ledger_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// TestToolConsumerQuota: one project's admin, registering tools, cannot
// take every consumer the server allows: a project gets at most
// MaxToolConsumersPerProject, and other projects are not affected.
func TestToolConsumerQuota(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	register := func(project, tool string) {
		t.Helper()
		_, err := e.l.RegisterToolYAML(ctx, project, []byte(fmt.Sprintf("tool_name: %s\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.%s\nafter_execution: suspend\n", tool, tool)))
		require.NoError(t, err)
	}
	for i := range ledger.MaxToolConsumersPerProject + 1 {
		register("greedy", fmt.Sprintf("t%d", i))
	}
	for i := range ledger.MaxToolConsumersPerProject {
		_, err := e.l.EnsureToolConsumer(ctx, "greedy", fmt.Sprintf("t%d", i))
		require.NoError(t, err)
	}
	_, err := e.l.EnsureToolConsumer(ctx, "greedy", fmt.Sprintf("t%d", ledger.MaxToolConsumersPerProject))
	requireViolation(t, err, "subject", protocol.VTooLarge, "project greedy already has")
	_, err = e.l.EnsureToolConsumer(ctx, "greedy", "t0")
	require.NoError(t, err, "an existing consumer is always answered")
	register("other", "svc")
	_, err = e.l.EnsureToolConsumer(ctx, "other", "svc")
	require.NoError(t, err, "another project is not affected")
}
