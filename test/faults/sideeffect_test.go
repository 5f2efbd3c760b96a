package faults

import (
	"bytes"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestSideEffectfulToolKilledAroundItsEffect is the seed's gate for
// side_effectful tools: pay, run by the executor in a child process
// (payexec), is killed with SIGKILL just before or just after its effect
// (before the report) and a fresh process started. The effect happens at
// most once, and the call ends with exactly one report and one wakeup:
// reconciled when pay has a reconcile and the effect happened, run as the
// next attempt when it has one and the effect did not happen, and
// outcome_unknown (failed, never run again) when it has none.
func TestSideEffectfulToolKilledAroundItsEffect(t *testing.T) {
	for _, tc := range []struct {
		name      string
		crash     string // where the first process is killed
		reconcile bool
		effects   int
		status    string
		outcome   string
	}{
		{"after_effect_reconciled", "after", true, 1, protocol.StatusSuccess, protocol.AttemptReconciled},
		{"after_effect_outcome_unknown", "after", false, 1, protocol.StatusFailed, protocol.AttemptOutcomeUnknown},
		{"before_effect_reconciled_not_done", "before", true, 1, protocol.StatusSuccess, ""},
		{"before_effect_outcome_unknown", "before", false, 0, protocol.StatusFailed, protocol.AttemptOutcomeUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := ledgertest.New(t)
			ctx := ledgertest.Ctx(t)
			api, err := e.L.ServeAPI(ctx, ledger.APIConfig{})
			require.NoError(t, err)
			t.Cleanup(api.Stop)
			_, err = e.L.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
			require.NoError(t, err)
			var wakeups atomic.Int32
			sub, err := e.NC.Subscribe(protocol.WakeupSubject("v1", "proj", "main", "worker"), func(*nats.Msg) { wakeups.Add(1) })
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			require.NoError(t, e.NC.Flush())

			effects := filepath.Join(t.TempDir(), "effects")
			log := newLogBuffer("ready", "attempt ", "effect ", "reconciled ")
			args := func(crash string) []string {
				a := []string{"-nats-url", e.Srv.URL(), "-effects", effects, "-crash", crash}
				if tc.reconcile {
					a = append(a, "-reconcile")
				}
				return a
			}
			first := newProc(t, "payexec", payexecBin, nil, log, args(tc.crash)...)
			first.start()
			require.True(t, waitFor(time.Minute, func() bool { return log.count("ready") == 1 }), "payexec pulls")

			c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-1", ID: "call-1", Epoch: 1, Tool: "pay"}
			_, err = e.L.Dispatch(ctx, c.Dispatch())
			require.NoError(t, err)
			point := "attempt "
			if tc.crash == "after" {
				point = "effect "
			}
			require.True(t, waitFor(time.Minute, func() bool { return log.count(point) == 1 }), "pay reaches the kill point")
			first.kill()

			second := newProc(t, "payexec-restarted", payexecBin, nil, log, args("none")...)
			second.start()
			var rec *protocol.CallRecord
			require.True(t, waitFor(time.Minute, func() bool {
				rec, err = e.L.GetCall(ctx, c.Project, c.Turn, c.ID)
				return err == nil && rec.State == protocol.StateWoken
			}), "the call is answered after the restart")
			first.requireNoCrash()
			second.requireNoCrash()

			lines := 0
			if b, err := os.ReadFile(effects); err == nil {
				lines = bytes.Count(b, []byte("\n"))
			}
			require.Equal(t, tc.effects, lines, "effects")
			require.Equal(t, tc.status, rec.Claim.Status)
			require.Equal(t, tc.outcome, rec.Outcome)
			card, err := e.L.GetCard(ctx, c.Project, rec.Claim.ToolResultCardID)
			require.NoError(t, err)
			tr, err := card.Card.ToolResult()
			require.NoError(t, err)
			if tc.outcome == protocol.AttemptOutcomeUnknown {
				require.NotNil(t, tr.Error)
				require.Contains(t, string(tr.Error.Detail), protocol.CodeToolOutcomeUnknown)
				require.Contains(t, string(tr.Error.Detail), "fix_hint")
			}

			kinds := map[string]int{}
			_, err = e.L.ReadEntries(ctx, 1, func(en protocol.Entry) error {
				kinds[nats.Header(en.Headers).Get(protocol.HeaderEntryKind)]++
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, 1, kinds[string(protocol.KindReport)], "exactly one report")
			require.Equal(t, 1, kinds[string(protocol.KindWakeup)], "exactly one wakeup entry")
			wantAttempts := 1
			if tc.crash == "before" && tc.reconcile {
				wantAttempts = 2
			}
			require.Equal(t, wantAttempts, kinds[string(protocol.KindAttempt)], "attempt entries")
			require.True(t, waitFor(time.Minute, func() bool { return wakeups.Load() >= 1 }), "the worker is woken")
			require.EqualValues(t, 1, wakeups.Load(), "one wakeup published")
		})
	}
}
