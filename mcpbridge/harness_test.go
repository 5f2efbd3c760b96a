package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/internal/testenv"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestMain runs the test binary as a fake MCP server when asked (the bad
// servers of bad_test.go), else the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("CGLEDGER_FAKE_MCP"); mode != "" {
		fakeServer(mode)
		return
	}
	os.Exit(m.Run())
}

// nodeServer is the command line of an npm MCP server of test/mcp/servers
// (installed by make tools with npm ci).
func nodeServer(t *testing.T, pkg string, args ...string) []string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Skip(t, "node is not installed")
	}
	main, err := filepath.Abs(filepath.Join("..", "test", "mcp", "servers", "node_modules", "@modelcontextprotocol", pkg, "dist", "index.js"))
	require.NoError(t, err)
	if _, err := os.Stat(main); err != nil {
		testenv.Skip(t, "%s is not installed (make tools, or npm ci in test/mcp/servers): %v", pkg, err)
	}
	return append([]string{node, main}, args...)
}

type rig struct {
	*ledgertest.Env
	b    *Bridge
	seq  atomic.Int64
	logs *logBuffer
}

// logBuffer keeps the bridge's logs for the tests to read (and prints them
// to standard error, for a failing test's story).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	os.Stderr.Write(p)
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{Env: ledgertest.New(t), logs: &logBuffer{}}
	_, err := r.L.SetRoster(ledgertest.Ctx(t), protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
	require.NoError(t, err)
	return r
}

// start runs a bridge with servers on the in-process ledger.
func (r *rig) start(t *testing.T, servers ...ServerConfig) *Bridge {
	t.Helper()
	b, err := New(&Config{Project: "proj", Servers: servers}, Deps{Registrar: r.L, Ledger: r.ledgerFor, Logger: r.logger()})
	require.NoError(t, err)
	require.NoError(t, b.Start(ledgertest.Ctx(t)))
	t.Cleanup(func() { b.Stop(context.Background()) })
	r.b = b
	return b
}

// ledgerFor is Deps.Ledger on the in-process ledger.
func (r *rig) ledgerFor(string) (executor.Ledger, *nats.Conn, error) { return r.L, r.NC, nil }

func (r *rig) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func strp(s string) *string { return &s }

// dispatch sends a call of tool (served on target) through the ledger.
func (r *rig) dispatch(t *testing.T, tool, target, args string, timeoutMS int64) ledgertest.Call {
	t.Helper()
	n := r.seq.Add(1)
	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: fmt.Sprintf("turn-%d", n), ID: fmt.Sprintf("call-%d", n), Epoch: 1, Tool: tool}
	req := c.Dispatch()
	req.Subject = "cg.v1.proj.main.cmd.tool." + target
	req.Card.Content = json.RawMessage(fmt.Sprintf(`{"tool_name":%q,"arguments":%s}`, tool, args))
	req.Payload.TimeoutMS = timeoutMS
	_, err := r.L.Dispatch(ledgertest.Ctx(t), req)
	require.NoError(t, err)
	return c
}

// result waits for the call's outcome and returns its result card content.
func (r *rig) result(t *testing.T, c ledgertest.Call) protocol.ToolResultContent {
	t.Helper()
	var rec *protocol.CallRecord
	require.Eventually(t, func() bool {
		var err error
		rec, err = r.L.GetCall(context.Background(), c.Project, c.Turn, c.ID)
		return err == nil && rec.State == protocol.StateWoken
	}, time.Minute, 10*time.Millisecond, "call %s resolves", c.ID)
	card, err := r.L.GetCard(context.Background(), c.Project, rec.Claim.ToolResultCardID)
	require.NoError(t, err)
	tr, err := card.Card.ToolResult()
	require.NoError(t, err)
	return tr
}

type detail struct {
	TaxonomyCode string              `json:"taxonomy_code"`
	Attempts     int                 `json:"attempts"`
	Progress     []executor.Progress `json:"progress"`
}

func errDetail(t *testing.T, tr protocol.ToolResultContent) detail {
	t.Helper()
	require.NotNil(t, tr.Error, "an error in %s", tr.Status)
	var d detail
	require.NoError(t, json.Unmarshal(tr.Error.Detail, &d))
	return d
}

func decodeResult(t *testing.T, tr protocol.ToolResultContent) Result {
	t.Helper()
	require.Equal(t, protocol.StatusSuccess, tr.Status, "%s", tr.Result)
	var res Result
	require.NoError(t, json.Unmarshal(tr.Result, &res))
	return res
}

// reports counts the report entries of call c.
func (r *rig) reports(t *testing.T, c ledgertest.Call) int {
	t.Helper()
	return r.entries(t, c, protocol.KindReport)
}

// entries counts the entries of kind of call c.
func (r *rig) entries(t *testing.T, c ledgertest.Call, kind protocol.EntryKind) int {
	t.Helper()
	n := 0
	_, err := r.L.ReadEntries(ledgertest.Ctx(t), 1, func(e protocol.Entry) error {
		h := nats.Header(e.Headers)
		if h.Get(protocol.HeaderEntryKind) == string(kind) && h.Get(protocol.HeaderToolCallID) == c.ID && h.Get(protocol.HeaderAgentTurnID) == c.Turn {
			n++
		}
		return nil
	})
	require.NoError(t, err)
	return n
}
