package conformance_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/conformance"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

const project = "proj"

// chargeDef is a side_effectful tool of the tests: the built-in executor
// records its intent with attempt.start.
var chargeDef = protocol.ToolDefinition{
	ToolName: "charge", Description: "conformance test tool with an effect", Parameters: []byte(`{"type":"object"}`),
	TargetSubject:  "cg.v1.{project_id}.{channel_id}.cmd.tool.charge",
	AfterExecution: protocol.AfterSuspend,
	Limits:         protocol.ToolLimits{TimeoutMSDefault: 10_000, TimeoutMSMax: 60_000, ConcurrencyMax: 4},
	Determinism:    protocol.DeterminismSideEffectful,
	Retry:          protocol.RetryPolicy{MaxAttempts: 1, BaseMS: 100, CapMS: 100},
}

// rig is a ledger serving its API on a real embedded server.
type rig struct {
	*ledgertest.Env
	c *client.Client
}

func newRig(t *testing.T) *rig {
	t.Helper()
	env := ledgertest.NewWithConfig(t, ledger.Config{
		DeadlineGrace: time.Second,
		BuiltinTools:  []protocol.ToolDefinition{*executor.EchoDefinition, *executor.SleepDefinition, chargeDef},
		ToolAckWait:   time.Second,
	})
	api, err := env.L.ServeAPI(ledgertest.Ctx(t), ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	return &rig{Env: env, c: client.New(env.NC, client.WithTimeout(30*time.Second))}
}

// startBuiltinExecutor runs the built-in executor (echo, sleep) in process,
// as serve does, with a short ack wait so that a long call needs
// heartbeats.
func (r *rig) startBuiltinExecutor(t *testing.T) {
	t.Helper()
	ex, err := executor.New(r.L, r.NC, executor.Config{AckWait: time.Second, TracerProvider: sdktrace.NewTracerProvider()})
	require.NoError(t, err)
	require.NoError(t, executor.RegisterBuiltins(ex))
	require.NoError(t, ex.Start(ledgertest.Ctx(t)))
	t.Cleanup(func() { ex.Stop(context.Background()) })
}

// startChargeExecutor runs the built-in executor with the side_effectful
// charge tool.
func (r *rig) startChargeExecutor(t *testing.T) {
	t.Helper()
	ex, err := executor.New(r.L, r.NC, executor.Config{AckWait: time.Second})
	require.NoError(t, err)
	require.NoError(t, ex.Register("charge", executor.ToolFunc(func(_ context.Context, call *executor.Call) executor.Outcome {
		return executor.Success(map[string]any{"charged": true})
	}), &chargeDef))
	require.NoError(t, ex.Start(ledgertest.Ctx(t)))
	t.Cleanup(func() { ex.Stop(context.Background()) })
}

// afterCheckerAttempt calls start once the checker has opened an attempt
// (executor cgledger-conformance): the side_effect_reconcile case races
// the service for it, which a service started earlier in this process
// would win.
func (r *rig) afterCheckerAttempt(t *testing.T, start func()) {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			found := false
			_, err := r.L.ReadEntries(ctx, 1, func(e protocol.Entry) error {
				if strings.Contains(e.Subject, ".ledger.attempt.") && strings.Contains(string(e.Data), `"executor_id":"cgledger-conformance"`) {
					found = true
				}
				return nil
			})
			if err == nil && found {
				start()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		t.Errorf("the checker never opened its attempt")
	}()
}

func fixture(t *testing.T, tool, yaml string) conformance.Fixture {
	t.Helper()
	f, err := conformance.ParseFixture([]byte(yaml), tool)
	require.NoError(t, err)
	return f
}

// fixtureFile reads the repository's fixture of a built-in tool, the one CI
// uses.
func fixtureFile(t *testing.T, tool string) conformance.Fixture {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("fixtures", tool+".yaml"))
	require.NoError(t, err)
	return fixture(t, tool, string(b))
}

func run(t *testing.T, r *rig, f conformance.Fixture, cases ...string) conformance.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := conformance.Run(ctx, conformance.Config{Conn: r.NC, Project: project, Fixture: f, Grace: time.Second, Cases: cases})
	require.NoError(t, err)
	for _, c := range rep.Cases {
		t.Logf("%-28s %-15s %s | expected: %s", c.Case, c.Outcome, c.Seen, c.Expected)
	}
	return rep
}

func outcomes(rep conformance.Report) map[string]conformance.Outcome {
	m := map[string]conformance.Outcome{}
	for _, c := range rep.Cases {
		m[c.Case] = c.Outcome
	}
	return m
}

// TestBuiltinToolsConform: the built-in executor's tools pass every case
// that applies to them; the cases their fixtures cannot produce are
// not_applicable, never failed.
func TestBuiltinToolsConform(t *testing.T) {
	r := newRig(t)
	r.startBuiltinExecutor(t)

	echo := run(t, r, fixtureFile(t, "echo"))
	require.True(t, echo.OK(), "echo fails no case")
	want := map[string]conformance.Outcome{
		conformance.CaseNormal: conformance.Pass, "status_success": conformance.Pass, "status_failed": conformance.NotApplicable,
		conformance.CaseMetadata: conformance.Pass, conformance.CaseTraceparent: conformance.Pass, conformance.CaseAfterExecution: conformance.Pass,
		conformance.CaseMissingCallID: conformance.Pass, conformance.CaseInlineArgs: conformance.Pass, conformance.CaseUnknownCard: conformance.Pass,
		conformance.CaseIdentityMismatch: conformance.Pass, conformance.CaseRedeliveryAfter: conformance.Pass, conformance.CaseDuplicateCommand: conformance.Pass,
		conformance.CaseCanceled: conformance.Pass, conformance.CaseRedeliveryBefore: conformance.NotApplicable, conformance.CaseSideEffectIntent: conformance.NotApplicable,
	}
	got := outcomes(echo)
	for k, v := range want {
		require.Equal(t, v, got[k], "echo: case %s", k)
	}

	sleep := run(t, r, fixtureFile(t, "sleep"), conformance.CaseNormal, "status_failed", "status_timeout", conformance.CaseRedeliveryBefore, conformance.CaseCanceledRunning, conformance.CaseDeadline, conformance.CaseHeartbeat)
	require.True(t, sleep.OK(), "sleep fails no case")
	require.Equal(t, 7, sleep.Passed, "sleep: every long-call case applies and passes (the executor's ack wait here is 1s)")

	// The reconcile case first, with the service started once the
	// checker's attempt is open; then intent, with it running.
	chargeFx := fixture(t, "charge", "determinism: side_effectful\nnormal: {args: {amount: 3}}\n")
	r.afterCheckerAttempt(t, func() { r.startChargeExecutor(t) })
	charge := run(t, r, chargeFx, conformance.CaseSideEffectReconcile)
	require.Equal(t, conformance.Pass, outcomes(charge)[conformance.CaseSideEffectReconcile])
	charge = run(t, r, chargeFx, conformance.CaseSideEffectIntent)
	require.Equal(t, conformance.Pass, outcomes(charge)[conformance.CaseSideEffectIntent])
}
