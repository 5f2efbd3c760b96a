package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/httpapi"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// holdForCLI stores call c's card and appends its held entry, as the ledger
// does for a dispatch it holds for approval.
func holdForCLI(t *testing.T, e *ledgertest.Env, c ledgertest.Call, at time.Time) {
	t.Helper()
	ctx := ledgertest.Ctx(t)
	d := c.Dispatch()
	_, err := e.L.PutCard(ctx, d.Card)
	require.NoError(t, err)
	data, err := json.Marshal(protocol.HeldEntry{
		ProjectID: c.Project, ChannelID: c.Channel, AgentID: c.Agent, AgentTurnID: c.Turn, TurnEpoch: c.Epoch,
		ToolCallID: c.ID, ToolName: c.Tool, ToolCallCardID: c.CardID(),
		ArgumentsDigest: protocol.ArgumentsDigest(json.RawMessage(`{"q":"` + c.ID + `"}`)), Reason: protocol.HeldForApproval,
		RequestedBy: protocol.ApprovalRequestedByWorker, ExpiresUnixMS: at.Add(time.Hour).UnixMilli(), CommandSubject: d.Subject, BudgetMS: 1000,
	})
	require.NoError(t, err)
	msg := &nats.Msg{Subject: protocol.HeldSubject("v1", c.Project, c.Channel, c.Turn, c.ID), Data: data, Header: nats.Header{}}
	msg.Header.Set(protocol.HeaderEntryKind, string(protocol.KindHeld))
	msg.Header.Set(protocol.HeaderTime, protocol.FormatTime(at))
	_, err = e.JS.PublishMsg(ctx, msg)
	require.NoError(t, err)
}

// runCLI runs the binary's verbs in process and returns the exit code and
// what they wrote to standard output.
func runCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	old := stdout
	stdout = &out
	defer func() { stdout = old }()
	return run(args), out.String()
}

// TestApprovalsCLI: list and show print the held calls from the views
// (show: the arguments exactly as the ledger holds them and their
// digest); approve and deny print the call first, need --digest or --yes,
// and send the card and the digest (the one given, else the one shown)
// through serve's HTTP API.
func TestApprovalsCLI(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	c1 := ledgertest.Call{Project: "proj", Channel: "main", Agent: "alice", Turn: "t1", ID: "c1", Epoch: 1, Tool: "deploy"}
	c2 := c1
	c2.ID = "c2"
	holdForCLI(t, e, c1, at)
	holdForCLI(t, e, c2, at.Add(time.Second))
	s, err := projector.OpenStore(filepath.Join(t.TempDir(), "views"), projector.StoreOptions{})
	require.NoError(t, err)
	defer s.Close()
	p, err := projector.New(s, e.JS, projector.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, p.CatchUp(ctx))
	var sent []protocol.ApprovalRequest
	var ops []string
	hs := httptest.NewServer(httpapi.Audit(projector.NewQueries(s), httpapi.AuditConfig{
		Decide: func(_ context.Context, op, approver string, req protocol.ApprovalRequest) (protocol.ApprovalResult, error) {
			require.Equal(t, "carol", approver)
			sent, ops = append(sent, req), append(ops, op)
			if req.ArgumentsDigest != protocol.ArgumentsDigest(json.RawMessage(`{"q":"`+req.ToolCallID+`"}`)) {
				return protocol.ApprovalResult{}, &protocol.Error{Code: protocol.CodeMismatch, Message: "arguments_digest is not the digest of the call's arguments"}
			}
			return protocol.ApprovalResult{Seq: 9, Decision: map[string]string{protocol.OpApprove: protocol.ApprovalApproved, protocol.OpDeny: protocol.ApprovalDenied}[op], CommandSeq: 10, DeadlineUnixMS: at.UnixMilli()}, nil
		},
		Approver: func(*http.Request) (string, bool) { return "carol", true },
	}))
	defer hs.Close()
	t.Setenv("CGLEDGER_NATS_CREDS", "")
	t.Setenv("CGLEDGER_DATA", t.TempDir())
	conn := []string{"--server", hs.URL, "--project", "proj"}
	digest1 := protocol.ArgumentsDigest(json.RawMessage(`{"q":"c1"}`))

	code, out := runCLI(t, append([]string{"approvals", "list"}, conn...)...)
	require.Equal(t, exitOK, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	require.Contains(t, lines[0], "call c1")
	require.Contains(t, lines[1], "call c2")

	code, out = runCLI(t, append([]string{"approvals", "show", "t1", "c1"}, conn...)...)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, `arguments  {"q":"c1"}`)
	require.Contains(t, out, "digest     "+digest1)
	require.Contains(t, out, "state      pending")

	code, _ = runCLI(t, append([]string{"approvals", "approve", "t1", "c1"}, conn...)...)
	require.Equal(t, exitUsage, code, "neither --digest nor --yes")
	require.Empty(t, sent)

	code, out = runCLI(t, append([]string{"approvals", "approve", "t1", "c1", "--yes", "--reason", "looks fine"}, conn...)...)
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "digest     "+digest1, "the digest acted on is shown")
	require.Contains(t, out, "approved (ledger seq 9); command released at seq 10")
	require.Equal(t, protocol.ApprovalRequest{ProjectID: "proj", AgentTurnID: "t1", ToolCallID: "c1", ToolCallCardID: "cc-t1-c1", ArgumentsDigest: digest1, Reason: "looks fine"}, sent[0])
	require.Equal(t, protocol.OpApprove, ops[0])

	wrong := protocol.ArgumentsDigest(json.RawMessage(`{"q":"other"}`))
	code, _ = runCLI(t, append([]string{"approvals", "deny", "t1", "c2", "--digest", wrong}, conn...)...)
	require.Equal(t, exitFailed, code, "the server refuses a digest that is not the call's")
	require.Equal(t, wrong, sent[1].ArgumentsDigest, "--digest is sent as given: the ledger checks it")
	require.Equal(t, protocol.OpDeny, ops[1])
}
