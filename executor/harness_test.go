package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

type rig struct {
	*ledgertest.Env
	ex  *executor.Executor
	reg *prometheus.Registry
	seq atomic.Int64
	// remote, when set, is the ledger the executor runs on and conn its
	// connection (an executor in another process); else the in-process
	// ledger on the Env's connection.
	remote executor.Ledger
	conn   *nats.Conn
}

// newRig starts a ledger and an executor with the built-ins plus extra
// implementations.
func newRig(t *testing.T, cfg executor.Config, extra map[string]impl) *rig {
	t.Helper()
	r := &rig{Env: ledgertest.New(t), reg: prometheus.NewRegistry()}
	_, err := r.L.SetRoster(ledgertest.Ctx(t), protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
	require.NoError(t, err)
	r.start(t, cfg, extra)
	return r
}

// newRemoteRig is newRig with the executor in another process: its ledger
// is a client.Client over the request/reply API, on a connection of its own.
func newRemoteRig(t *testing.T, cfg executor.Config, extra map[string]impl) *rig {
	t.Helper()
	r := apiRig(t, ledgertest.New(t))
	r.conn = r.Srv.Connect(t)
	r.remote = client.New(r.conn)
	r.start(t, cfg, extra)
	return r
}

// apiRig is a rig on env whose ledger serves the request/reply API and
// knows the roster entry the calls use; its executor is not started.
func apiRig(t *testing.T, env *ledgertest.Env) *rig {
	t.Helper()
	r := &rig{Env: env, reg: prometheus.NewRegistry()}
	api, err := r.L.ServeAPI(ledgertest.Ctx(t), ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	_, err = r.L.SetRoster(ledgertest.Ctx(t), protocol.RosterEntry{ProjectID: "proj", AgentID: "agent", WorkerTarget: "worker"})
	require.NoError(t, err)
	return r
}

type impl struct {
	tool executor.Tool
	def  *protocol.ToolDefinition
}

func (r *rig) start(t *testing.T, cfg executor.Config, extra map[string]impl) {
	t.Helper()
	if cfg.Registerer == nil {
		cfg.Registerer = r.reg
	}
	var l executor.Ledger = r.L
	nc := r.NC
	if r.remote != nil {
		l, nc = r.remote, r.conn
	}
	ex, err := executor.New(l, nc, cfg)
	require.NoError(t, err)
	require.NoError(t, executor.RegisterBuiltins(ex))
	for name, im := range extra {
		require.NoError(t, ex.Register(name, im.tool, im.def))
	}
	require.NoError(t, ex.Start(ledgertest.Ctx(t)))
	r.ex = ex
	t.Cleanup(func() { ex.Stop(context.Background()) })
}

// def is a built-in-style definition for a test implementation.
func def(name, determinism string, retry protocol.RetryPolicy, concurrency int) *protocol.ToolDefinition {
	return &protocol.ToolDefinition{
		ToolName: name, Parameters: json.RawMessage(`{"type":"object"}`),
		TargetSubject:  "cg.v1.{project_id}.{channel_id}.cmd.tool." + name,
		AfterExecution: protocol.AfterSuspend,
		Limits:         protocol.ToolLimits{TimeoutMSDefault: 10_000, TimeoutMSMax: 60_000, ConcurrencyMax: concurrency},
		Determinism:    determinism, Retry: retry,
	}
}

type callOpts struct {
	tool        string // tool_name
	target      string // subject target (default tool)
	args        string
	timeoutMS   int64
	traceparent string
}

// dispatch sends a call through the ledger and returns its identity.
func (r *rig) dispatch(t *testing.T, o callOpts) ledgertest.Call {
	t.Helper()
	c, _ := r.dispatchResult(t, o)
	return c
}

// dispatchResult is dispatch, with the dispatch's answer.
func (r *rig) dispatchResult(t *testing.T, o callOpts) (ledgertest.Call, protocol.DispatchResult) {
	t.Helper()
	if o.target == "" {
		o.target = o.tool
	}
	if o.args == "" {
		o.args = "{}"
	}
	n := r.seq.Add(1)
	c := ledgertest.Call{Project: "proj", Channel: "main", Agent: "agent", Turn: fmt.Sprintf("turn-%d", n), ID: fmt.Sprintf("call-%d", n), Epoch: 1, Tool: o.tool}
	req := c.Dispatch()
	req.Subject = "cg.v1.proj.main.cmd.tool." + o.target
	req.Card.Content = json.RawMessage(fmt.Sprintf(`{"tool_name":%q,"arguments":%s}`, o.tool, o.args))
	req.Payload.TimeoutMS = o.timeoutMS
	req.Identity.Traceparent = o.traceparent
	res, err := r.L.Dispatch(ledgertest.Ctx(t), req)
	require.NoError(t, err)
	return c, res
}

// result waits for the call's report and returns its record and result card.
func (r *rig) result(t *testing.T, c ledgertest.Call) (*protocol.CallRecord, protocol.ToolResultContent, *protocol.StoredCard) {
	t.Helper()
	var rec *protocol.CallRecord
	require.Eventually(t, func() bool {
		var err error
		rec, err = r.L.GetCall(context.Background(), c.Project, c.Turn, c.ID)
		return err == nil && rec.State == protocol.StateWoken
	}, 30*time.Second, 5*time.Millisecond, "call %s resolves", c.ID)
	card, err := r.L.GetCard(context.Background(), c.Project, rec.Claim.ToolResultCardID)
	require.NoError(t, err)
	tr, err := card.Card.ToolResult()
	require.NoError(t, err)
	return rec, tr, card
}

type detail struct {
	TaxonomyCode string               `json:"taxonomy_code"`
	FixHint      string               `json:"fix_hint"`
	Attempts     int                  `json:"attempts"`
	RetryAfterMS int64                `json:"retry_after_ms"`
	Violations   []protocol.Violation `json:"violations"`
}

func errDetail(t *testing.T, tr protocol.ToolResultContent) detail {
	t.Helper()
	require.NotNil(t, tr.Error)
	var d detail
	require.NoError(t, json.Unmarshal(tr.Error.Detail, &d))
	return d
}

// allEntries returns every ledger entry's subject, headers and data.
func (r *rig) allEntries(t *testing.T) []protocol.Entry {
	t.Helper()
	var out []protocol.Entry
	_, err := r.L.ReadEntries(ledgertest.Ctx(t), 1, func(e protocol.Entry) error {
		out = append(out, e)
		return nil
	})
	require.NoError(t, err)
	return out
}

func (r *rig) entriesOfKind(t *testing.T, kind protocol.EntryKind) []protocol.Entry {
	t.Helper()
	var out []protocol.Entry
	for _, e := range r.allEntries(t) {
		if nats.Header(e.Headers).Get(protocol.HeaderEntryKind) == string(kind) {
			out = append(out, e)
		}
	}
	return out
}

// count is the number of entries on subjects matching filter.
func (r *rig) count(t *testing.T, filter string) int {
	t.Helper()
	js, err := r.NC.JetStream()
	require.NoError(t, err)
	info, err := js.StreamInfo(stream.DefaultName, &nats.StreamInfoRequest{SubjectsFilter: filter})
	require.NoError(t, err)
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}

// commandRejections counts rejection entries of refused commands.
func (r *rig) commandRejections(t *testing.T) int {
	t.Helper()
	n := 0
	for _, e := range r.entriesOfKind(t, protocol.KindRejection) {
		var re protocol.RejectionEntry
		require.NoError(t, json.Unmarshal(e.Data, &re))
		if re.Op == protocol.OpCommand {
			n++
		}
	}
	return n
}
