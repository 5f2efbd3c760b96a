package mcpfront_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/mcpfront"
	"github.com/cgledger/cgledger/protocol"
	"github.com/cgledger/cgledger/stream"
)

const (
	project = "proj"
	agent   = "agent-1"
)

// rig is a real ledger serving its API, an executor with echo and sleep,
// and a front door for agent-1 of proj reaching the ledger through a client
// acting as that agent.
type rig struct {
	*ledgertest.Env
	cl *client.Client
}

func newRig(t *testing.T) *rig {
	t.Helper()
	// The ledger knows the executor's built-ins, as serve's does: the
	// front door's dispatch checks ask it whether a tool exists.
	env := ledgertest.NewWithConfig(t, ledger.Config{BuiltinTools: []protocol.ToolDefinition{*executor.EchoDefinition, *executor.SleepDefinition}})
	ctx := ledgertest.Ctx(t)
	api, err := env.L.ServeAPI(ctx, ledger.APIConfig{})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	keeper, err := env.L.StartDeadlineKeeper(ctx, ledger.DeadlineKeeperConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = keeper.Stop(context.Background()) })
	ex, err := executor.New(env.L, env.NC, executor.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, executor.RegisterBuiltins(ex))
	require.NoError(t, ex.Start(ctx))
	t.Cleanup(func() { ex.Stop(context.Background()) })
	// strict: echo behind a schema, to be refused by it.
	_, err = env.L.RegisterToolYAML(ctx, project, []byte(`tool_name: strict
description: Echo with a strict schema.
parameters: {type: object, properties: {q: {type: string}, n: {type: integer}}, required: [q, n], additionalProperties: false}
target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo
after_execution: suspend
determinism: idempotent
`))
	require.NoError(t, err)
	return &rig{Env: env, cl: client.New(env.Srv.Connect(t), client.WithActor(agent))}
}

func (r *rig) front(t *testing.T, progress time.Duration) *mcpfront.Front {
	t.Helper()
	f, err := mcpfront.New(mcpfront.Config{Project: project, Agent: agent, Ledger: r.cl, ProgressInterval: progress,
		Builtins: []*protocol.ToolDefinition{executor.EchoDefinition, executor.SleepDefinition}})
	require.NoError(t, err)
	return f
}

// stdio connects the front door's stdio transport to pipes and returns the
// other ends.
func stdio(t *testing.T, f *mcpfront.Front, max int) (toServer io.WriteCloser, fromServer io.ReadCloser) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Server().Run(ctx, &mcpfront.StdioTransport{In: inR, Out: outW, MaxMessageBytes: max})
		outW.Close()
	}()
	t.Cleanup(func() {
		cancel()
		inW.Close()
		<-done
	})
	return inW, outR
}

// goClient is the Go SDK's client on the front door over stdio.
func goClient(t *testing.T, f *mcpfront.Front, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	w, r := stdio(t, f, 0)
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts)
	cs, err := c.Connect(ledgertest.Ctx(t), &mcp.IOTransport{Reader: r, Writer: w}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func TestToolsListShowsTheProjectsTools(t *testing.T) {
	r := newRig(t)
	cs := goClient(t, r.front(t, 0), nil)
	res, err := cs.ListTools(ledgertest.Ctx(t), nil)
	require.NoError(t, err)
	byName := map[string]*mcp.Tool{}
	var names []string
	for _, tl := range res.Tools {
		byName[tl.Name] = tl
		names = append(names, tl.Name)
	}
	require.Equal(t, []string{"echo", "sleep", "strict"}, names)
	strict := byName["strict"]
	require.Equal(t, "Echo with a strict schema.", strict.Description)
	schema, err := json.Marshal(strict.InputSchema)
	require.NoError(t, err)
	require.JSONEq(t, `{"type":"object","properties":{"q":{"type":"string"},"n":{"type":"integer"}},"required":["q","n"],"additionalProperties":false}`, string(schema))
	require.True(t, strict.Annotations.IdempotentHint)
	require.False(t, strict.Annotations.ReadOnlyHint)
	require.False(t, *strict.Annotations.DestructiveHint)
	require.True(t, byName["echo"].Annotations.ReadOnlyHint, "echo is pure")
}

func TestToolsCallIsOneLedgerCall(t *testing.T) {
	r := newRig(t)
	ctx := ledgertest.Ctx(t)
	cs := goClient(t, r.front(t, 0), nil)
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"x": 1}, Meta: mcp.Meta{mcpfront.MetaToolCallID: "k1"}}
	res, err := cs.CallTool(ctx, params)
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Len(t, res.Content, 1)
	require.JSONEq(t, `{"x":1}`, res.Content[0].(*mcp.TextContent).Text)
	require.Equal(t, "success", res.Meta[mcpfront.MetaStatus])
	turn := res.Meta[mcpfront.MetaAgentTurnID].(string)
	require.True(t, strings.HasPrefix(turn, "mcp-"), turn)
	rec, err := r.L.GetCall(ctx, project, turn, "k1")
	require.NoError(t, err)
	require.Equal(t, agent, rec.AgentID)
	require.Equal(t, uint64(mcpfront.TurnEpoch), rec.TurnEpoch)
	require.Equal(t, mcpfront.DefaultChannel, rec.ChannelID)
	require.NotNil(t, rec.Claim)

	// The same call again: the ledger's stored outcome, nothing run twice.
	again, err := cs.CallTool(ctx, params)
	require.NoError(t, err)
	require.Equal(t, true, again.Meta[mcpfront.MetaDuplicate])
	require.Equal(t, res.Meta[mcpfront.MetaReportSeq], again.Meta[mcpfront.MetaReportSeq])
}

func TestBadArgumentsListEveryViolation(t *testing.T) {
	r := newRig(t)
	ctx := ledgertest.Ctx(t)
	cs := goClient(t, r.front(t, 0), nil)

	// An unknown tool and an id that is no identifier: the ledger refuses
	// the dispatch (checks.registered) with both, and records it.
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "nope", Arguments: map[string]any{}, Meta: mcp.Meta{mcpfront.MetaToolCallID: "bad id"}})
	var we *jsonrpc.Error
	require.ErrorAs(t, err, &we)
	require.EqualValues(t, jsonrpc.CodeInvalidParams, we.Code)
	vs := violations(t, we.Data)
	require.ElementsMatch(t, []string{"_meta.cgledger/tool_call_id:invalid_token", "name:not_found"}, vs)
	r.requireRejection(t, we.Data, "nope")

	// An unknown tool alone: not_found, the project's nearest names given.
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "strikt", Arguments: map[string]any{}, Meta: mcp.Meta{mcpfront.MetaToolCallID: "k1"}})
	require.ErrorAs(t, err, &we)
	require.EqualValues(t, jsonrpc.CodeInvalidParams, we.Code)
	require.Equal(t, []string{"name:not_found"}, violations(t, we.Data))
	require.Contains(t, string(we.Data), "nearest: strict")
	r.requireRejection(t, we.Data, "strikt")

	// Arguments the tool's schema refuses: the ledger refuses the dispatch
	// (checks.arguments) with every violation, on record; no call exists.
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "strict", Arguments: map[string]any{"q": 5, "extra": true}, Meta: mcp.Meta{mcpfront.MetaToolCallID: "k2"}})
	require.ErrorAs(t, err, &we)
	require.EqualValues(t, jsonrpc.CodeInvalidParams, we.Code)
	require.ElementsMatch(t, []string{"arguments.q:type", "arguments.n:required", "arguments:additionalProperties"}, violations(t, we.Data))
	turn := r.requireRejection(t, we.Data, "strict")
	_, err = r.L.GetCall(ctx, project, turn, "k2")
	require.Error(t, err, "a refused call is not dispatched")

	// Arguments that are not an object: the card's own rule, on record.
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: []int{1}, Meta: mcp.Meta{mcpfront.MetaToolCallID: "k3"}})
	require.ErrorAs(t, err, &we)
	require.Equal(t, []string{"arguments:invalid_type"}, violations(t, we.Data))
	r.requireRejection(t, we.Data, "echo")

	// An id that is not a string no dispatch can carry as sent (7 is not
	// "7"): the front door refuses it itself, with the rest it finds, and
	// nothing is recorded.
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "nope", Arguments: []int{1}, Meta: mcp.Meta{mcpfront.MetaToolCallID: 7}})
	require.ErrorAs(t, err, &we)
	require.ElementsMatch(t, []string{"_meta.cgledger/tool_call_id:invalid_type", "arguments:invalid_type", "name:not_found"}, violations(t, we.Data))
	var local struct {
		Seq uint64 `json:"rejection_seq"`
	}
	require.NoError(t, json.Unmarshal(we.Data, &local))
	require.Zero(t, local.Seq, "a refusal of the front door's own is not recorded")

	// Good arguments still run.
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "strict", Arguments: map[string]any{"q": "x", "n": 2}, Meta: mcp.Meta{mcpfront.MetaToolCallID: "k4"}})
	require.NoError(t, err)
	require.False(t, res.IsError, "%+v", res.Content)
}

// requireRejection asserts the refusal in data is recorded: its
// rejection_seq holds a rejection entry of op dispatch with the same
// violations (in the dispatch's fields), whose request names tool and asks
// for both checks. It returns the call's turn.
func (r *rig) requireRejection(t *testing.T, data json.RawMessage, tool string) string {
	t.Helper()
	var d struct {
		Code       string               `json:"code"`
		Seq        uint64               `json:"rejection_seq"`
		Turn       string               `json:"agent_turn_id"`
		Violations []protocol.Violation `json:"violations"`
	}
	require.NoError(t, json.Unmarshal(data, &d))
	require.NotZero(t, d.Seq, "the refusal is recorded: %s", data)
	ctx := ledgertest.Ctx(t)
	st, err := r.JS.Stream(ctx, stream.DefaultName)
	require.NoError(t, err)
	m, err := st.GetMsg(ctx, d.Seq)
	require.NoError(t, err)
	require.Equal(t, string(protocol.KindRejection), m.Header.Get(protocol.HeaderEntryKind))
	var re protocol.RejectionEntry
	require.NoError(t, json.Unmarshal(m.Data, &re))
	require.Equal(t, protocol.OpDispatch, re.Op)
	require.Equal(t, d.Code, string(re.Code))
	// Every violation answered is on record, under the dispatch's field
	// its message names (an id the dispatch carries twice is answered
	// once).
	recorded := map[string]string{}
	for _, v := range re.Violations {
		recorded[v.Field] = v.Code
	}
	require.GreaterOrEqual(t, len(re.Violations), len(d.Violations))
	for _, v := range d.Violations {
		i := strings.LastIndex(v.Message, " (")
		require.Positive(t, i, "%+v names no dispatch field", v)
		field := strings.TrimSuffix(v.Message[i+2:], " of the dispatch)")
		require.Equal(t, v.Code, recorded[field], "answered %+v, recorded %+v", v, re.Violations)
	}
	require.Contains(t, string(re.Request.Data), `"checks":{"registered":true,"arguments":true}`)
	require.Contains(t, string(re.Request.Data), `"tool_name":"`+tool+`"`)
	return d.Turn
}

func violations(t *testing.T, data json.RawMessage) []string {
	t.Helper()
	var pe protocol.Error
	require.NoError(t, json.Unmarshal(data, &pe))
	var out []string
	for _, v := range pe.Violations {
		out = append(out, v.Field+":"+v.Code)
	}
	return out
}

func TestTimeoutIsAToolErrorWithItsCode(t *testing.T) {
	r := newRig(t)
	cs := goClient(t, r.front(t, 0), nil)
	res, err := cs.CallTool(ledgertest.Ctx(t), &mcp.CallToolParams{Name: "sleep", Arguments: map[string]any{"ms": 60000},
		Meta: mcp.Meta{mcpfront.MetaToolCallID: "slow", mcpfront.MetaTimeoutMS: 300}})
	require.NoError(t, err)
	require.True(t, res.IsError)
	require.Equal(t, "timeout", res.Meta[mcpfront.MetaStatus])
	text := res.Content[0].(*mcp.TextContent).Text
	require.Contains(t, text, "deadline")
	sc, ok := res.StructuredContent.(map[string]any)
	require.True(t, ok, "%T", res.StructuredContent)
	require.Equal(t, "timeout", sc["status"])
	require.NotEmpty(t, sc["taxonomy_code"])
	require.True(t, strings.HasPrefix(text, sc["taxonomy_code"].(string)+": "), text)
}

func TestProgressAndCancel(t *testing.T) {
	r := newRig(t)
	var mu sync.Mutex
	var got []float64
	cs := goClient(t, r.front(t, 50*time.Millisecond), &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, req.Params.Progress)
		},
	})
	ctx, cancel := context.WithCancel(ledgertest.Ctx(t))
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sleep", Arguments: map[string]any{"ms": 60000},
			Meta: mcp.Meta{"progressToken": "p1", mcpfront.MetaToolCallID: "long"}})
		errc <- err
	}()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 3
	}, time.Minute, 10*time.Millisecond, "progress while the call runs")
	mu.Lock()
	require.Less(t, got[0], got[2], "progress increases")
	mu.Unlock()
	cancel()
	require.True(t, errors.Is(<-errc, context.Canceled))
	// The client's cancel is the call's: the ledger records it and the
	// executor ends the call canceled.
	require.Eventually(t, func() bool {
		recs, err := findCall(r, "long")
		return err == nil && recs.Claim != nil && recs.Claim.Status == protocol.StatusCanceled
	}, time.Minute, 20*time.Millisecond)
}

// findCall reads the call of id in whatever turn the session had.
func findCall(r *rig, id string) (*protocol.CallRecord, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := r.JS.KeyValue(ctx, "CG_CALLS")
	if err != nil {
		return nil, err
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var rec protocol.CallRecord
		if json.Unmarshal(e.Value(), &rec) == nil && rec.ToolCallID == id {
			// The bucket holds what dispatch wrote; the report and its
			// wakeup are the stream's to tell (GetCall reads them).
			return r.L.GetCall(ctx, rec.ProjectID, rec.AgentTurnID, rec.ToolCallID)
		}
	}
	return nil, errors.New("not found")
}

// TestRawStdio speaks JSON-RPC by hand: what no SDK client sends.
func TestRawStdio(t *testing.T) {
	r := newRig(t)
	w, out := stdio(t, r.front(t, 0), 4096)
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	send := func(s string) {
		_, err := io.WriteString(w, s+"\n")
		require.NoError(t, err)
	}
	type reply struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *jsonrpc.Error  `json:"error"`
	}
	next := func() reply {
		require.True(t, lines.Scan(), "a reply")
		var rp reply
		require.NoError(t, json.Unmarshal(lines.Bytes(), &rp), lines.Text())
		return rp
	}
	send(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	require.Nil(t, next().Error)
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)

	send(`{"jsonrpc":"2.0","id":1,"method":`)
	rp := next()
	require.EqualValues(t, jsonrpc.CodeParseError, rp.Error.Code)
	require.Equal(t, "null", string(rp.ID))

	send(`{"jsonrpc":"2.0","id":2,"method":"tools/fly"}`)
	rp = next()
	require.EqualValues(t, jsonrpc.CodeMethodNotFound, rp.Error.Code)

	send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"pad":"` + strings.Repeat("x", 5000) + `"}}}`)
	rp = next()
	require.EqualValues(t, jsonrpc.CodeInvalidRequest, rp.Error.Code)
	require.Contains(t, rp.Error.Message, "4096")

	// The request id keys the call: the same request again is the same
	// call, answered with its stored outcome.
	call := `{"jsonrpc":"2.0","id":"req.7","method":"tools/call","params":{"name":"echo","arguments":{"y":2}}}`
	send(call)
	first := next()
	require.Nil(t, first.Error)
	send(call)
	second := next()
	require.Nil(t, second.Error)
	var a, b mcp.CallToolResult
	require.NoError(t, json.Unmarshal(first.Result, &a))
	require.NoError(t, json.Unmarshal(second.Result, &b))
	require.Equal(t, a.Meta[mcpfront.MetaReportSeq], b.Meta[mcpfront.MetaReportSeq])
	require.Nil(t, a.Meta[mcpfront.MetaDuplicate])
	require.Equal(t, true, b.Meta[mcpfront.MetaDuplicate])
	require.Equal(t, mcpfront.ToolCallIDFromRequestID(json.RawMessage(`"req.7"`)), a.Meta[mcpfront.MetaToolCallID])
}

func TestToolCallIDFromRequestID(t *testing.T) {
	require.Equal(t, "rpc-7", mcpfront.ToolCallIDFromRequestID(json.RawMessage(`7`)))
	require.Equal(t, `rpc-"7"`, mcpfront.ToolCallIDFromRequestID(json.RawMessage(`"7"`)))
	h := mcpfront.ToolCallIDFromRequestID(json.RawMessage(`"a.b"`))
	require.True(t, strings.HasPrefix(h, "rpc-h"), h)
	require.Equal(t, h, mcpfront.ToolCallIDFromRequestID(json.RawMessage(`"a.b"`)))
	require.True(t, protocol.ValidIdentifier(h))
}

// TestStdioAnswersCallsInFlightAtEOF: a client that writes its calls and
// closes its end of the input still gets every answer, and only then does
// the session end.
func TestStdioAnswersCallsInFlightAtEOF(t *testing.T) {
	r := newRig(t)
	w, out := stdio(t, r.front(t, 0), 0)
	_, err := io.WriteString(w, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":700}}}
{"jsonrpc":"2.0","id":"two","method":"tools/call","params":{"name":"echo","arguments":{"e":1}}}
`)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	// out ends when Run returns (the stdio helper closes it then).
	all, err := io.ReadAll(out)
	require.NoError(t, err)
	results := map[string]mcp.CallToolResult{}
	for _, line := range strings.Split(strings.TrimSpace(string(all)), "\n") {
		var rp struct {
			ID     json.RawMessage    `json:"id"`
			Result mcp.CallToolResult `json:"result"`
			Error  *jsonrpc.Error     `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rp), line)
		require.Nil(t, rp.Error, line)
		results[string(rp.ID)] = rp.Result
	}
	require.Len(t, results, 3, "initialize and both calls answered: %s", all)
	require.Equal(t, protocol.StatusSuccess, results["1"].Meta[mcpfront.MetaStatus])
	require.Equal(t, protocol.StatusSuccess, results[`"two"`].Meta[mcpfront.MetaStatus])
}
