package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/projector"
	"github.com/cgledger/cgledger/protocol"
)

// deployTool is a tool every call of which waits for carol's approval; the
// built-in echo implementation runs it once released.
const deployTool = `tool_name: deploy
parameters: {type: object}
target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.echo
after_execution: suspend
approval:
  required: true
  approvers: [carol]
`

// registerTool registers a tool definition in project demo with the CLI
// (serve's admin credential, or none without authentication).
func registerTool(t *testing.T, s *server, def string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tool.yaml")
	require.NoError(t, os.WriteFile(path, []byte(def), 0o600))
	out, code := s.run(t, "tools", "register", path, "--project", "demo")
	require.Equal(t, 0, code, out)
}

// startCall runs `cgledger call` against s in the background: it
// dispatches at once, then waits for the result, which a held call does
// not have until it is decided (and which a killed serve never answers).
// The process is killed when the test ends.
func startCall(t *testing.T, s *server, turn, call, args string) {
	t.Helper()
	cmd := exec.Command(binary, "call", "--project", "demo", "--agent", "alice", "--tool", "deploy", "--args", args,
		"--turn", turn, "--call-id", call, "--timeout", "2m")
	cmd.Env = append(os.Environ(), "CGLEDGER_NATS_URL="+s.natsURL(), "CGLEDGER_SERVER="+s.httpURL())
	if s.Data != "" {
		cmd.Env = append(cmd.Env, "CGLEDGER_DATA="+s.Data)
	}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
}

// approvalItems lists project demo's approvals in state (pending, decided,
// all) with `cgledger approvals list --json`, as creds.
func approvalItems(t *testing.T, s *server, creds, state string) []protocol.ApprovalItem {
	t.Helper()
	out, code := s.run(t, "approvals", "list", "--project", "demo", "--state", state, "--creds", creds, "--json")
	if code != 0 {
		return nil
	}
	var items []protocol.ApprovalItem
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var page struct {
			Items []protocol.ApprovalItem `json:"items"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &page), line)
		items = append(items, page.Items...)
	}
	return items
}

// waitApproval waits until call's approval row is in state (pending or a
// decision) and returns it.
func waitApproval(t *testing.T, s *server, creds, call, state string) protocol.ApprovalItem {
	t.Helper()
	var it protocol.ApprovalItem
	require.Eventually(t, func() bool {
		for _, i := range approvalItems(t, s, creds, protocol.ApprovalListAll) {
			if i.ToolCallID == call {
				it = i
				return i.State == state
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond, "call %s's approval is %s (last seen %q)", call, state, it.State)
	return it
}

// callEntryCounts counts, from `cgledger export`, the entries of each kind
// about call (by its CG-Tool-Call-Id), wakeups by phase ("wakeup" for a
// result's, "wakeup.approved" for the approved notice).
func callEntryCounts(t *testing.T, s *server, call string) map[string]int {
	t.Helper()
	out := filepath.Join(t.TempDir(), "ledger.jsonl")
	msg, code := s.run(t, "export", "--out", out)
	require.Equal(t, 0, code, msg)
	f, err := os.Open(out)
	require.NoError(t, err)
	defer f.Close()
	n := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var e struct {
			Headers map[string][]string `json:"headers"`
			JSON    json.RawMessage     `json:"json"` // a compact JSON payload
			Data    []byte              `json:"data"` // any other payload, base64
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e))
		if first(e.Headers[protocol.HeaderToolCallID]) != call {
			continue
		}
		kind := first(e.Headers[protocol.HeaderEntryKind])
		if kind == string(protocol.KindWakeup) {
			var w struct {
				Phase string `json:"phase"`
			}
			payload := []byte(e.JSON)
			if len(payload) == 0 {
				payload = e.Data
			}
			if json.Unmarshal(payload, &w) == nil && w.Phase == protocol.ApprovalApproved {
				kind += ".approved"
			}
		}
		n[kind]++
	}
	require.NoError(t, sc.Err())
	return n
}

// e2eCallState is what the tests read of a call's state.
type e2eCallState struct {
	State            string `json:"state"`
	ReportedSeq      uint64 `json:"reported_seq"`
	CommandSeq       uint64 `json:"command_seq"`
	ToolResultCardID string `json:"tool_result_card_id"`
	Status           string `json:"status"`
}

// readCall reads the call's state from the audit API (as serve's admin
// when serve has credentials).
func readCall(t *testing.T, s *server, turn, call string) (e2eCallState, int) {
	t.Helper()
	var ans struct {
		Call e2eCallState `json:"call"`
	}
	url := s.httpURL() + "/v1/projects/demo/turns/" + turn + "/calls/" + call
	if s.Data == "" {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		_ = json.NewDecoder(resp.Body).Decode(&ans)
		return ans.Call, resp.StatusCode
	}
	code := s.getJSON(t, url, &ans)
	return ans.Call, code
}

// waitReported waits until the call has its report and returns its state.
func waitReported(t *testing.T, s *server, turn, call string) e2eCallState {
	t.Helper()
	var st e2eCallState
	require.Eventually(t, func() bool {
		var code int
		st, code = readCall(t, s, turn, call)
		return code == http.StatusOK && st.ReportedSeq != 0
	}, 2*time.Minute, 200*time.Millisecond, "call %s/%s is reported", turn, call)
	return st
}

// inboxCount counts the call's items in agent alice's inbox (audit API).
func inboxCount(t *testing.T, s *server, call string) int {
	t.Helper()
	var page struct {
		Items []struct {
			ToolCallID string `json:"tool_call_id"`
		} `json:"items"`
	}
	require.Equal(t, http.StatusOK, s.getJSON(t, s.httpURL()+"/v1/projects/demo/agents/alice/inbox?state=all&limit=1000", &page))
	n := 0
	for _, it := range page.Items {
		if it.ToolCallID == call {
			n++
		}
	}
	return n
}

// requireExactlyOnce checks a held call ended with one of everything:
// one held entry, one decision, one report and its wakeup, one inbox item,
// and (approved) one command and one approved wakeup, or (else) no command
// at all.
func requireExactlyOnce(t *testing.T, s *server, call string, approved bool) {
	t.Helper()
	// The result's wakeup follows its report (and, after a kill between
	// the two, the restarted serve's sweep appends it): the counts are read
	// once it is there, then must be exact.
	var n map[string]int
	require.Eventually(t, func() bool {
		n = callEntryCounts(t, s, call)
		return n[string(protocol.KindWakeup)] > 0
	}, 2*time.Minute, 200*time.Millisecond, "call %s's result wakeup is stored", call)
	require.Equal(t, 1, n[string(protocol.KindHeld)], "one held entry: %v", n)
	require.Equal(t, 1, n[string(protocol.KindApproval)], "one decision: %v", n)
	require.Equal(t, 1, n[string(protocol.KindReport)], "one report: %v", n)
	require.Equal(t, 1, n[string(protocol.KindWakeup)], "one result wakeup: %v", n)
	if approved {
		require.Equal(t, 1, n[string(protocol.KindCommand)], "the command exists exactly once: %v", n)
		require.Equal(t, 1, n[string(protocol.KindWakeup)+".approved"], "one approved wakeup: %v", n)
	} else {
		require.Zero(t, n[string(protocol.KindCommand)], "a call not approved has no command: %v", n)
	}
	require.Equal(t, 1, inboxCount(t, s, call), "the worker's inbox has the call once")
}

// TestApprovalSurvivesKillsOfServe: a held call through real processes,
// with serve killed -9 after the dispatch (the call stays held), between
// the approve decision and its command (the restarted serve's approval
// keeper releases it, and the approver's retried approve is refused
// conflict), and right after an approve and a deny returned: every call
// ends with exactly one report, one command when approved, none when
// denied, one inbox item.
func TestApprovalSurvivesKillsOfServe(t *testing.T) {
	data := t.TempDir()
	natsPort, httpPort := servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, natsPort, httpPort)
	registerTool(t, s, deployTool)
	carol := s.issue(t, "--project", "demo", "--role", "approver", "--approver", "carol", "--ttl", "0")
	dave := s.issue(t, "--project", "demo", "--role", "approver", "--approver", "dave", "--ttl", "0")
	ledgerCreds := s.issue(t, "--role", "ledger", "--ttl", "0")
	worker := s.issue(t, "--project", "demo", "--role", "worker", "--agent", "alice", "--ttl", "0")
	setRoster(t, s.connectAs(t, worker))

	// 1. Dispatched and held; serve killed; the restarted serve still
	// holds it, with the same arguments and digest.
	startCall(t, s, "t1", "k1", `{"text":"release 1.4.2"}`)
	held := waitApproval(t, s, carol.Path, "k1", protocol.ApprovalPending)
	require.JSONEq(t, `{"text":"release 1.4.2"}`, string(held.Arguments))
	require.Equal(t, protocol.ArgumentsDigest(held.Arguments), held.ArgumentsDigest)
	s.kill(t)
	s = startServer(t, data, natsPort, httpPort)
	again := waitApproval(t, s, carol.Path, "k1", protocol.ApprovalPending)
	require.Equal(t, held.ArgumentsDigest, again.ArgumentsDigest)
	require.Equal(t, held.HeldSeq, again.HeldSeq, "the restart held nothing twice")
	st, code := readCall(t, s, "t1", "k1")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, protocol.StateAwaitingApproval, st.State, "no command while held")
	require.Zero(t, callEntryCounts(t, s, "k1")[string(protocol.KindCommand)])

	// An approver the tool does not list is refused, and changes nothing.
	out, errOut, code := s.runAll(t, "approvals", "approve", "--project", "demo", "t1", "k1", "--yes", "--creds", dave.Path)
	require.NotEqual(t, 0, code, out)
	require.Contains(t, errOut, "forbidden")

	// 2. The decision stored, serve killed before its command: the
	// decision is appended here exactly as the ledger's approve appends it
	// (a ledger credential, the approval subject, expect-last-subject-seq
	// 0), and serve is killed at once, well within the keeper's 10 s grace
	// for the decider to finish.
	decided := time.Now().UnixMilli()
	appendDecision(t, s, ledgerCreds, again, protocol.ApprovalApproved, "carol", decided)
	s.kill(t)
	s = startServer(t, data, natsPort, httpPort)
	st = waitReported(t, s, "t1", "k1")
	require.Equal(t, projector.StateReported, st.State)
	requireExactlyOnce(t, s, "k1", true)
	// The approver's retry meets the decision: conflict, naming it.
	out, errOut, code = s.runAll(t, "approvals", "approve", "--project", "demo", "t1", "k1", "--digest", again.ArgumentsDigest, "--creds", carol.Path)
	require.NotEqual(t, 0, code, out)
	require.Contains(t, errOut, "conflict")
	require.Contains(t, errOut, "already decided: approved by carol")
	requireExactlyOnce(t, s, "k1", true)

	// 3. Approved with the CLI, serve killed as the approve returns (the
	// command released): the restarted serve runs it once.
	startCall(t, s, "t1", "k2", `{"text":"release 1.4.3"}`)
	k2 := waitApproval(t, s, carol.Path, "k2", protocol.ApprovalPending)
	out, code = s.run(t, "approvals", "approve", "--project", "demo", "t1", "k2", "--digest", k2.ArgumentsDigest, "--reason", "ticket 88", "--creds", carol.Path)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `{"text":"release 1.4.3"}`, "approve prints the arguments it decides on")
	require.Contains(t, out, k2.ArgumentsDigest)
	require.Contains(t, out, "command released at seq")
	s.kill(t)
	s = startServer(t, data, natsPort, httpPort)
	waitReported(t, s, "t1", "k2")
	requireExactlyOnce(t, s, "k2", true)
	require.Equal(t, "ticket 88", waitApproval(t, s, carol.Path, "k2", protocol.ApprovalApproved).Reason)

	// 4. Denied, serve killed as the deny returns: one failed report, no
	// command ever.
	startCall(t, s, "t1", "k3", `{"text":"release 2.0.0"}`)
	waitApproval(t, s, carol.Path, "k3", protocol.ApprovalPending)
	out, code = s.run(t, "approvals", "deny", "--project", "demo", "t1", "k3", "--yes", "--reason", "freeze", "--creds", carol.Path)
	require.Equal(t, 0, code, out)
	s.kill(t)
	s = startServer(t, data, natsPort, httpPort)
	waitReported(t, s, "t1", "k3")
	requireExactlyOnce(t, s, "k3", false)
	require.Equal(t, "freeze", waitApproval(t, s, carol.Path, "k3", protocol.ApprovalDenied).Reason)
}

// appendDecision appends a held call's decision as the ledger's approve
// does, with a ledger credential: on the call's approval subject with
// expect-last-subject-seq 0, the held entry's identity headers, the
// approver as actor. It stands for a serve that stored the decision and
// died before anything else.
func appendDecision(t *testing.T, s *server, c credential, it protocol.ApprovalItem, decision, approver string, at int64) {
	t.Helper()
	opts := []nats.Option{nats.UserCredentials(c.Path)}
	if c.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	nc, err := nats.Connect(s.natsURL(), opts...)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := js.Stream(ctx, "CG_LEDGER")
	require.NoError(t, err)
	m, err := stream.GetMsg(ctx, it.HeldSeq)
	require.NoError(t, err)
	var h protocol.HeldEntry
	require.NoError(t, json.Unmarshal(m.Data, &h))
	data, err := json.Marshal(protocol.ApprovalEntry{ProjectID: h.ProjectID, ChannelID: h.ChannelID, AgentID: h.AgentID,
		AgentTurnID: h.AgentTurnID, TurnEpoch: h.TurnEpoch, ToolCallID: h.ToolCallID, ToolName: h.ToolName,
		ToolCallCardID: h.ToolCallCardID, ArgumentsDigest: h.ArgumentsDigest, Decision: decision, Approver: approver,
		DecidedUnixMS: at, HeldSeq: it.HeldSeq})
	require.NoError(t, err)
	hdr := nats.Header{}
	for k, v := range m.Header {
		hdr[k] = append([]string(nil), v...)
	}
	hdr.Set(protocol.HeaderEntryKind, string(protocol.KindApproval))
	hdr.Set(protocol.HeaderMsgID, fmt.Sprintf("approval.%s.%s.%s.%s.%s.%d", h.ProjectID, h.AgentTurnID, h.ToolCallID, decision, approver, at))
	hdr.Set(protocol.HeaderTime, protocol.FormatTime(time.UnixMilli(at)))
	hdr.Set(protocol.HeaderActor, approver)
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: protocol.ApprovalSubject(protocol.DefaultVersion, h.ProjectID, h.ChannelID, h.AgentTurnID, h.ToolCallID),
		Header: hdr, Data: data}, jetstream.WithExpectLastSequencePerSubject(0), jetstream.WithExpectStream("CG_LEDGER"))
	require.NoError(t, err)
}

// TestApprovalExpiresAcrossARestart: serve is down when a held call's
// approval expires; the restarted serve's approval keeper decides it
// expired, ends it with one failed report (P-PRECOND-APPROVAL-EXPIRED),
// and an approve that comes later is refused conflict.
func TestApprovalExpiresAcrossARestart(t *testing.T) {
	data := t.TempDir()
	natsPort, httpPort := servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, natsPort, httpPort)
	// 15 s: enough for the hold to show in the views before the kill on a
	// loaded machine, short enough to wait out.
	registerTool(t, s, deployTool+"  timeout_ms: 15000\n")
	carol := s.issue(t, "--project", "demo", "--role", "approver", "--approver", "carol", "--ttl", "0")
	setRoster(t, s.connectAs(t, s.issue(t, "--project", "demo", "--role", "worker", "--agent", "alice")))
	startCall(t, s, "t1", "x1", `{"text":"too late"}`)
	held := waitApproval(t, s, carol.Path, "x1", protocol.ApprovalPending)
	require.True(t, time.Now().Before(held.ExpiresAt), "serve is killed before the expiry (held %s, expires %s)", held.RequestedAt, held.ExpiresAt)
	s.kill(t)
	killed := time.Now()
	require.Eventually(t, func() bool { return time.Now().After(held.ExpiresAt.Add(time.Second)) }, time.Minute, 100*time.Millisecond,
		"the expiry passes while serve is down")

	s = startServer(t, data, natsPort, httpPort)
	st := waitReported(t, s, "t1", "x1")
	require.Equal(t, protocol.StatusFailed, st.Status)
	it := waitApproval(t, s, carol.Path, "x1", protocol.ApprovalExpired)
	require.Equal(t, protocol.ApprovalExpirySource, it.Approver)
	require.NotNil(t, it.DecidedAt)
	require.True(t, it.DecidedAt.After(killed), "the restarted serve decided the expiry (decided %s, killed %s)", it.DecidedAt, killed)
	requireExactlyOnce(t, s, "x1", false)

	var card struct {
		Card struct {
			Card protocol.Card `json:"card"`
		} `json:"card"`
	}
	require.Equal(t, http.StatusOK, s.getJSON(t, s.httpURL()+"/v1/projects/demo/cards/"+st.ToolResultCardID, &card))
	tr, err := card.Card.Card.ToolResult()
	require.NoError(t, err)
	require.NotNil(t, tr.Error)
	require.Equal(t, protocol.ErrorCodeBadRequest, tr.Error.Code)
	require.Contains(t, string(tr.Error.Detail), protocol.TaxonomyApprovalExpired)

	out, errOut, code := s.runAll(t, "approvals", "approve", "--project", "demo", "t1", "x1", "--yes", "--creds", carol.Path)
	require.NotEqual(t, 0, code, out)
	require.Contains(t, errOut, "conflict")
	require.Contains(t, errOut, "expired by "+protocol.ApprovalExpirySource)
	requireExactlyOnce(t, s, "x1", false)
}

// startSharedServe runs `cgledger serve --nats-url url --no-auth` with
// roles on a data directory of its own, until the test ends, and waits
// until it is ready. Its client verbs reach the shared nats-server.
func startSharedServe(t *testing.T, url, roles string) *server {
	t.Helper()
	var natsPort int
	_, err := fmt.Sscanf(url, "nats://127.0.0.1:%d", &natsPort)
	require.NoError(t, err, url)
	s := addrs(natsPort, servetest.FreePort(t))
	s.Log = &servetest.LogBuffer{}
	s.Cmd = exec.Command(binary, "serve", "--data", t.TempDir(), "--nats-url", url, "--no-auth", "--roles", roles,
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", s.HTTPPort), "--log-format", "json")
	s.Cmd.Stdout, s.Cmd.Stderr = s.Log, s.Log
	require.NoError(t, s.Cmd.Start())
	t.Cleanup(func() {
		if s.Cmd.ProcessState == nil {
			_ = s.Cmd.Process.Kill()
			_ = s.Cmd.Wait()
		}
		if t.Failed() {
			t.Logf("serve (%s) log:\n%s", roles, s.Log.String())
		}
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get(s.httpURL() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 2*time.Minute, 50*time.Millisecond, "serve (%s) becomes ready", roles)
	return s
}

// TestApprovalAcrossTwoServes: two serve processes share one ledger on one
// nats-server. The call is dispatched through the first (api and
// projector: no executor) and approved through it (`cgledger approvals
// approve --approver`, serve being without credentials); the first is
// killed -9 as the approve returns; the second (the only executor) runs
// the call, and both the approval and the one report show there.
func TestApprovalAcrossTwoServes(t *testing.T) {
	ns := natstest.Start(t)
	a := startSharedServe(t, ns.URL(), "api,projector")
	b := startSharedServe(t, ns.URL(), "api,projector,executor")
	registerTool(t, a, deployTool)
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	setRoster(t, nc)

	startCall(t, a, "t2", "s1", `{"text":"shared"}`)
	var held protocol.ApprovalItem
	require.Eventually(t, func() bool {
		for _, it := range approvalItems(t, b, "", protocol.ApprovalPending) {
			if it.ToolCallID == "s1" {
				held = it
				return true
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond, "the held call shows on the other serve too")

	// Without credentials serve takes the approver from the request:
	// the CLI's --approver.
	out, code := a.run(t, "approvals", "approve", "--project", "demo", "t2", "s1", "--digest", held.ArgumentsDigest,
		"--reason", "shared ok", "--approver", "carol", "--json")
	require.Equal(t, 0, code, out)
	var res protocol.ApprovalResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, protocol.ApprovalApproved, res.Decision)
	require.NotZero(t, res.CommandSeq)
	a.kill(t)

	st := waitReported(t, b, "t2", "s1")
	require.Equal(t, protocol.StatusSuccess, st.Status, "the executor of the other serve ran the call")
	it := waitApproval(t, b, "", "s1", protocol.ApprovalApproved)
	require.Equal(t, "carol", it.Approver)
	n := callEntryCounts(t, b, "s1")
	require.Equal(t, 1, n[string(protocol.KindWakeup)+".approved"], "%v", n)
	require.Equal(t, 1, n[string(protocol.KindWakeup)], "%v", n)
	require.Equal(t, 1, n[string(protocol.KindCommand)], "%v", n)
	require.Equal(t, 1, n[string(protocol.KindReport)], "%v", n)
	require.Equal(t, 1, n[string(protocol.KindApproval)], "%v", n)
}

// setRoster gives agent alice of project demo a worker target, so her
// calls' wakeups are published (not skipped) and can be counted.
func setRoster(t *testing.T, nc *nats.Conn) {
	t.Helper()
	r := req(t, nc, "cgledger.v1.demo.alice.roster.set", nil, map[string]string{"project_id": "demo", "agent_id": "alice", "worker_target": "worker-alice"})
	require.True(t, r.OK, "%+v", r.Error)
}
