package faults

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestSideEffectfulToolServiceKilledAroundItsEffect is the seed's gate for
// a side_effectful tool served on the wire: toolsvc -side-effectful (a
// separate process with nothing but a NATS client, a tool credential and
// the requests of docs/protocol.md: tool.consumer, call.get, cancel.get,
// card.get, attempt.start, card.put, report, and the JetStream pull under
// the answered api_prefix) appends one line per effect to a file. It is
// killed with SIGKILL at each step between its attempt and its report
// (after attempt.start, after the effect, after card.put) and a fresh one
// started; the consumer redelivers the command to it. The effect happens at
// most once and as the outcome says, and the call ends with exactly one
// report and one wakeup: reconciled (or run as the next attempt, when the
// effect had not happened) with a reconcile, outcome_unknown without.
func TestSideEffectfulToolServiceKilledAroundItsEffect(t *testing.T) {
	for _, tc := range []struct {
		name      string
		crash     string // where the first process is killed
		reconcile bool
		effects   int
		status    string
		outcome   string
		attempts  int
	}{
		{"after_attempt_reconciled_not_done", "attempt", true, 1, protocol.StatusSuccess, "", 2},
		{"after_attempt_outcome_unknown", "attempt", false, 0, protocol.StatusFailed, protocol.AttemptOutcomeUnknown, 1},
		{"after_effect_reconciled", "effect", true, 1, protocol.StatusSuccess, protocol.AttemptReconciled, 1},
		{"after_effect_outcome_unknown", "effect", false, 1, protocol.StatusFailed, protocol.AttemptOutcomeUnknown, 1},
		{"after_card_put_reconciled", "card", true, 1, protocol.StatusSuccess, protocol.AttemptReconciled, 1},
		{"after_card_put_outcome_unknown", "card", false, 1, protocol.StatusFailed, protocol.AttemptOutcomeUnknown, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := ledgertest.Ctx(t)
			srv := natstest.Start(t, natstest.WithAuth())
			nc := srv.Connect(t)
			// A short ack wait: the killed service's command comes back
			// in about a second instead of 30.
			l, err := ledger.Open(ctx, nc, ledger.Config{ToolAckWait: time.Second})
			require.NoError(t, err)
			t.Cleanup(l.Close)
			api, err := l.ServeAPI(ctx, ledger.APIConfig{})
			require.NoError(t, err)
			t.Cleanup(api.Stop)
			_, err = l.SetRoster(ctx, protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
			require.NoError(t, err)
			_, err = l.RegisterTool(ctx, &protocol.ToolDefinition{
				ProjectID: "proj", ToolName: "pay", Parameters: json.RawMessage(`{"type":"object"}`),
				TargetSubject: "cg.v1.{project_id}.{channel_id}.cmd.tool.pay", AfterExecution: protocol.AfterSuspend,
				Determinism: protocol.DeterminismSideEffectful,
				Limits:      protocol.ToolLimits{TimeoutMSDefault: 120_000, TimeoutMSMax: 120_000, ConcurrencyMax: 4},
			})
			require.NoError(t, err)
			var wakeups atomic.Int32
			sub, err := nc.Subscribe(protocol.WakeupSubject("v1", "proj", "main", "worker"), func(*nats.Msg) { wakeups.Add(1) })
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			require.NoError(t, nc.Flush())

			cred := srv.Issue(t, auth.Grant{Role: auth.RoleTool, Project: "proj", Tool: "pay"}, time.Hour)
			creds := filepath.Join(t.TempDir(), "pay.creds")
			require.NoError(t, os.WriteFile(creds, cred.Creds, 0o600))
			effects := filepath.Join(t.TempDir(), "effects")
			log := newLogBuffer("ready ", "crash-point ", "reported ", "refused ", "failed ")
			args := func(crash string) []string {
				a := []string{"-nats-url", srv.URL(), "-creds", creds, "-inbox-prefix", cred.InboxPrefix,
					"-project", "proj", "-target", "pay", "-source-id", "svc.pay",
					"-side-effectful", "-effects", effects, "-crash", crash}
				if tc.reconcile {
					a = append(a, "-reconcile")
				}
				return a
			}
			first := newProc(t, "toolsvc-pay", toolsvcBin, nil, log, args(tc.crash)...)
			first.start()
			require.True(t, waitFor(time.Minute, func() bool { return first.exited() || log.count("ready ") == 1 }), "toolsvc pulls")
			require.False(t, first.exited(), "toolsvc exited at start")

			c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: "turn-1", ID: "call-1", Epoch: 1, Tool: "pay"}
			_, err = l.Dispatch(ctx, c.Dispatch())
			require.NoError(t, err)
			require.True(t, waitFor(time.Minute, func() bool { return first.exited() || log.count("crash-point ") == 1 }), "toolsvc reaches the kill point")
			first.kill()

			second := newProc(t, "toolsvc-pay-restarted", toolsvcBin, nil, log, args("none")...)
			second.start()
			var rec *protocol.CallRecord
			require.True(t, waitFor(time.Minute, func() bool {
				rec, err = l.GetCall(ctx, c.Project, c.Turn, c.ID)
				return err == nil && rec.State == protocol.StateWoken
			}), "the call is answered after the restart")
			require.True(t, waitFor(time.Minute, func() bool { return log.count("reported ") == 1 }), "the restarted service acks the command")
			first.requireNoCrash()
			second.requireNoCrash()
			require.Zero(t, log.count("refused "), "the ledger refused a request of the service")
			require.Zero(t, log.count("failed "), "a request of the service failed")

			lines := 0
			if b, err := os.ReadFile(effects); err == nil {
				lines = bytes.Count(b, []byte("\n"))
			}
			require.Equal(t, tc.effects, lines, "effects")
			require.Equal(t, tc.status, rec.Claim.Status)
			require.Equal(t, tc.outcome, rec.Outcome)
			require.Equal(t, "svc.pay", rec.Claim.SourceID, "reported by the service, not ended by the ledger")
			card, err := l.GetCard(ctx, c.Project, rec.Claim.ToolResultCardID)
			require.NoError(t, err)
			tr, err := card.Card.ToolResult()
			require.NoError(t, err)
			if tc.outcome == protocol.AttemptOutcomeUnknown {
				require.NotNil(t, tr.Error)
				require.Contains(t, string(tr.Error.Detail), protocol.CodeToolOutcomeUnknown)
				require.Contains(t, string(tr.Error.Detail), "fix_hint")
			}

			kinds := map[string]int{}
			_, err = l.ReadEntries(ctx, 1, func(en protocol.Entry) error {
				kinds[nats.Header(en.Headers).Get(protocol.HeaderEntryKind)]++
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, 1, kinds[string(protocol.KindReport)], "exactly one report")
			require.Equal(t, 1, kinds[string(protocol.KindWakeup)]+kinds[string(protocol.KindWakeupSkipped)], "exactly one wakeup entry")
			require.Equal(t, tc.attempts, kinds[string(protocol.KindAttempt)], "attempt entries")
			require.Zero(t, kinds[string(protocol.KindRejection)], "no request was refused")
			require.True(t, waitFor(time.Minute, func() bool { return wakeups.Load() >= 1 }), "the worker is woken")
			require.EqualValues(t, 1, wakeups.Load(), "one wakeup published")
		})
	}
}
