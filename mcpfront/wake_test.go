package mcpfront_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/mcpfront"
	"github.com/cgledger/cgledger/protocol"
)

// countingLedger is the agent's client, counting the front door's reads
// of call records: with wakeups heard, a call is read at dispatch, on its
// wakeup and on a slow fallback poll only.
type countingLedger struct {
	*client.Client
	reads atomic.Int64
}

func (c *countingLedger) GetCall(ctx context.Context, project, turnID, callID string) (*protocol.CallRecord, error) {
	c.reads.Add(1)
	return c.Client.GetCall(ctx, project, turnID, callID)
}

// logBuffer collects the front door's log for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// wakingFront is a front door that hears wakeups on nc, as `cgledger mcp
// serve` and serve's /mcp do.
func (r *rig) wakingFront(t *testing.T) (*mcpfront.Front, *countingLedger, *logBuffer) {
	t.Helper()
	nc := r.Srv.Connect(t)
	cl := &countingLedger{Client: client.New(nc, client.WithActor(agent))}
	logs := &logBuffer{}
	f, err := mcpfront.New(mcpfront.Config{Project: project, Agent: agent, Ledger: cl,
		Builtins: []*protocol.ToolDefinition{executor.EchoDefinition, executor.SleepDefinition},
		Logger:   slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Subscribe: func(subject string, fn func([]byte)) (func(), error) {
			sub, err := nc.Subscribe(subject, func(m *nats.Msg) { fn(m.Data) })
			if err != nil {
				return nil, err
			}
			return func() { _ = sub.Unsubscribe() }, nil
		}})
	require.NoError(t, err)
	return f, cl, logs
}

// wakeups records the wakeups a worker of target hears: a plain
// subscription, like the agent's own worker's.
func wakeups(t *testing.T, r *rig, target string) func() []string {
	t.Helper()
	var mu sync.Mutex
	var calls []string
	sub, err := r.Srv.Connect(t).Subscribe(protocol.WakeupSubject(protocol.DefaultVersion, project, "*", target), func(m *nats.Msg) {
		var w struct {
			ToolCallID string `json:"tool_call_id"`
		}
		_ = json.Unmarshal(m.Data, &w)
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, w.ToolCallID)
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), calls...)
	}
}

func sleepCall(t *testing.T, cs *mcp.ClientSession, id string, ms int) {
	t.Helper()
	res, err := cs.CallTool(ledgertest.Ctx(t), &mcp.CallToolParams{Name: "sleep", Arguments: map[string]any{"ms": ms},
		Meta: mcp.Meta{mcpfront.MetaToolCallID: id}})
	require.NoError(t, err)
	require.False(t, res.IsError, "%+v", res.Content)
	require.Equal(t, protocol.StatusSuccess, res.Meta[mcpfront.MetaStatus])
}

// An agent with no roster entry gets one naming itself, and its calls are
// answered on their wakeups: a 2.5 s call is read at dispatch, on its
// wakeup and by the fallback polls (1 s, 3 s, 7 s, ... however slow the
// machine, a few); polling alone (every 20 ms doubling to 500 ms) would
// read it ten times.
func TestWakeupAnswersTheCall(t *testing.T) {
	r := newRig(t)
	ctx := ledgertest.Ctx(t)
	_, err := r.cl.GetRoster(ctx, project, agent)
	require.ErrorIs(t, err, protocol.ErrNotFound, "the agent starts with no roster entry")
	heard := wakeups(t, r, agent)
	f, cl, _ := r.wakingFront(t)
	cs := goClient(t, f, nil)

	sleepCall(t, cs, "wake-1", 2500)
	require.LessOrEqual(t, cl.reads.Load(), int64(6), "the call is answered on its wakeup, not by polling")
	ro, err := r.cl.GetRoster(ctx, project, agent)
	require.NoError(t, err)
	require.Equal(t, agent, ro.WorkerTarget, "the front door set the agent's worker target to the agent")
	require.Eventually(t, func() bool { return len(heard()) == 1 }, time.Minute, 10*time.Millisecond)
	require.Equal(t, []string{"wake-1"}, heard(), "a worker of the target hears the wakeup too")

	// The next call finds the roster entry and sets none.
	sleepCall(t, cs, "wake-2", 10)
	ro2, err := r.cl.GetRoster(ctx, project, agent)
	require.NoError(t, err)
	require.Equal(t, ro.Seq, ro2.Seq, "one roster.set only")
}

// An agent whose worker set a roster entry keeps it: the front door hears
// the wakeups of that worker target beside the worker, which still gets
// every one of them.
func TestWakeupKeepsTheWorkersRoster(t *testing.T) {
	r := newRig(t)
	ctx := ledgertest.Ctx(t)
	set, err := r.cl.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "worker-x"})
	require.NoError(t, err)
	worker := wakeups(t, r, "worker-x")
	f, cl, _ := r.wakingFront(t)
	cs := goClient(t, f, nil)

	sleepCall(t, cs, "kept-1", 2500)
	require.LessOrEqual(t, cl.reads.Load(), int64(6), "the call is answered on its wakeup, not by polling")
	ro, err := r.cl.GetRoster(ctx, project, agent)
	require.NoError(t, err)
	require.Equal(t, set.Seq, ro.Seq, "the worker's roster entry stands")
	require.Equal(t, "worker-x", ro.WorkerTarget)
	require.Eventually(t, func() bool { return len(worker()) == 1 }, time.Minute, 10*time.Millisecond)
	require.Equal(t, []string{"kept-1"}, worker(), "the worker got the wakeup")
}

// A roster that moves to another worker target leaves the front door
// deaf to the call's wakeup: a fallback poll answers it, and the next call
// reads the roster again and hears the new target's wakeups.
func TestWakeupFollowsARosterThatMoved(t *testing.T) {
	r := newRig(t)
	ctx := ledgertest.Ctx(t)
	_, err := r.cl.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "worker-x"})
	require.NoError(t, err)
	f, _, logs := r.wakingFront(t)
	cs := goClient(t, f, nil)
	sleepCall(t, cs, "moved-1", 10)
	require.Contains(t, logs.String(), ".cmd.agent.worker-x.wakeup")

	_, err = r.cl.SetRoster(ctx, protocol.RosterEntry{ProjectID: project, AgentID: agent, WorkerTarget: "worker-y"})
	require.NoError(t, err)
	sleepCall(t, cs, "moved-2", 1500)
	require.NotContains(t, logs.String(), ".cmd.agent.worker-y.wakeup", "still deaf: the roster is read again after a miss")
	sleepCall(t, cs, "moved-3", 10)
	require.Contains(t, logs.String(), ".cmd.agent.worker-y.wakeup", "the miss made the front door read the roster again")
}
