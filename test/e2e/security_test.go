package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

// TestServeHTTPScopesAndNATSRefusals runs the binary as a new user would and
// attacks it from outside: no credentials, another project's credentials,
// a worker where an admin is needed.
func TestServeHTTPScopesAndNATSRefusals(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	info, err := os.Stat(filepath.Join(s.Data, "auth", "admin.creds"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the admin credential is private")

	// No credential: NATS refuses the connection, HTTP answers 401.
	_, err = nats.Connect(s.natsURL())
	require.Error(t, err)
	for _, path := range []string{"/v1/projects/demo/turns/t1/timeline", "/v1/digest", "/v1/export", "/projects/demo/tools"} {
		resp, err := http.Get(s.httpURL() + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, path)
		require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Bearer")
	}
	resp, err := http.Get(s.httpURL() + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "health needs no credential")

	// Replacing a project's tool needs that project's admin.
	def := "tool_name: echo\nparameters: {type: object}\ntarget_subject: cg.v1.{project_id}.{channel_id}.cmd.tool.evil\nafter_execution: suspend\n"
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"--project", "other", "--role", "admin"}, http.StatusForbidden},
		{[]string{"--project", "demo", "--role", "worker"}, http.StatusForbidden},
		{[]string{"--project", "demo", "--role", "auditor"}, http.StatusForbidden},
		{[]string{"--project", "demo", "--role", "admin"}, http.StatusCreated},
	} {
		c := s.issue(t, tc.args...)
		resp := httpAs(t, c, "POST", s.httpURL()+"/projects/demo/tools", def)
		require.Equal(t, tc.want, resp.StatusCode, "%v", tc.args)
	}
	// The audit API of a project: its auditor yes, another project's no, a
	// worker no; the whole-ledger endpoints need "*".
	other := s.issue(t, "--project", "other", "--role", "auditor")
	demo := s.issue(t, "--project", "demo", "--role", "auditor")
	worker := s.issue(t, "--project", "demo", "--role", "worker")
	require.Equal(t, http.StatusForbidden, httpAs(t, other, "GET", s.httpURL()+"/v1/projects/demo/tools", "").StatusCode)
	require.Equal(t, http.StatusForbidden, httpAs(t, worker, "GET", s.httpURL()+"/v1/projects/demo/tools", "").StatusCode)
	require.Equal(t, http.StatusOK, httpAs(t, demo, "GET", s.httpURL()+"/v1/projects/demo/tools", "").StatusCode)
	require.Equal(t, http.StatusForbidden, httpAs(t, demo, "GET", s.httpURL()+"/v1/export", "").StatusCode)
	garbage := credential{JWT: "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.AAAA"}
	require.Equal(t, http.StatusUnauthorized, httpAs(t, garbage, "GET", s.httpURL()+"/v1/projects/demo/tools", "").StatusCode)

	// A credential that expired is refused by NATS and HTTP alike.
	short := s.issue(t, "--project", "demo", "--role", "auditor", "--ttl", "1s")
	require.Eventually(t, func() bool {
		return httpAs(t, short, "GET", s.httpURL()+"/v1/projects/demo/tools", "").StatusCode == http.StatusUnauthorized
	}, time.Minute, 100*time.Millisecond)
	// The server may accept the CONNECT and then close the connection as
	// expired: either way, nothing can be sent on it.
	if nc, err := nats.Connect(s.natsURL(), nats.UserCredentials(short.Path), nats.NoReconnect()); err == nil {
		require.Eventually(t, nc.IsClosed, time.Minute, 10*time.Millisecond, "expired credential's connection is closed")
	}

	// Bad grants are refused with every problem listed.
	out, code := s.run(t, "creds", "issue", "--role", "tool", "--project", "a.b", "--agent", "x")
	require.Equal(t, 2, code, out)
}

// TestServeRefusesAMissingLedger: with the stream gone (deleted outside,
// restored wrongly), serve does not create an empty ledger and call it
// ready; it says what is wrong and exits.
func TestServeRefusesAMissingLedger(t *testing.T) {
	data := t.TempDir()
	natsPort, httpPort := servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, natsPort, httpPort)
	_, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"x"}`)
	require.Equal(t, 0, code)
	s.kill(t)

	streams, err := filepath.Glob(filepath.Join(data, "jetstream", "jetstream", "*", "streams", "CG_LEDGER"))
	require.NoError(t, err)
	require.Len(t, streams, 1)
	require.NoError(t, os.RemoveAll(streams[0]))

	cmd := exec.Command(binary, "serve", "--data", data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", natsPort),
		"--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort))
	done := make(chan []byte, 1)
	go func() {
		out, _ := cmd.CombinedOutput()
		done <- out
	}()
	select {
	case out := <-done:
		require.Equal(t, 1, cmd.ProcessState.ExitCode(), string(out))
		require.Contains(t, string(out), "ledger stream missing")
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("serve kept running on a missing ledger")
	}
}

// TestServeNoAuthIsExplicit: --no-auth opens NATS and HTTP, and says so.
func TestServeNoAuthIsExplicit(t *testing.T) {
	data := t.TempDir()
	s := startServer(t, data, servetest.FreePort(t), servetest.FreePort(t), "--no-auth")
	resp, err := http.Get(s.httpURL() + "/v1/digest")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "no bearer token needed")
	nc, err := nats.Connect(s.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	// One account for everyone: inbox.list, which serve's projector
	// answers, is not answered on a reply subject that is not an inbox,
	// and is recorded as every operation is (docs/protocol.md).
	require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: "cgledger.v1.demo.alice.inbox.list", Reply: "myreply.1", Data: []byte(`{"project_id":"demo","agent_id":"alice"}`)}))
	js, err := nc.JetStream()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		m, err := js.GetLastMsg("CG_LEDGER", "cg.v1._._.ledger.rejection.bad_request")
		if err != nil {
			return false
		}
		var re struct {
			Op         string `json:"op"`
			Violations []struct {
				Field string `json:"field"`
			} `json:"violations"`
		}
		require.NoError(t, json.Unmarshal(m.Data, &re))
		return re.Op == "inbox.list" && len(re.Violations) == 1 && re.Violations[0].Field == "reply" && m.Header.Get("CG-Project-Id") == "demo"
	}, time.Minute, 50*time.Millisecond, "the refusal of inbox.list is recorded")
	require.Contains(t, s.Log.String(), "authentication is OFF")
	_, err = os.Stat(filepath.Join(data, "auth"))
	require.True(t, os.IsNotExist(err), "no keys are made without auth")
}

// TestOperatorSkipsACorruptEntry: on a server without authentication (the
// only way an outsider's message reaches the stream), a bogus entry kind is
// recorded as unrecognized and the server stays ready; a corrupt card entry
// makes it not ready until `cgledger projector skip`, which is recorded and
// un-sticks it without a restart.
func TestOperatorSkipsACorruptEntry(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t), "--no-auth")
	readyz := func() (int, map[string]any) {
		resp, err := http.Get(s.httpURL() + "/readyz")
		if err != nil {
			return 0, nil
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	_, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"x"}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 0, code)

	nc, err := nats.Connect(s.natsURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := nc.JetStream()
	require.NoError(t, err)
	bogus := &nats.Msg{Subject: "cg.v1.demo.card.zzz", Header: nats.Header{"CG-Entry-Kind": {"bogus"}}, Data: []byte(`{}`)}
	ack, err := js.PublishMsg(bogus)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c, body := readyz()
		applied, _ := body["applied_seq"].(float64)
		return c == http.StatusOK && uint64(applied) >= ack.Sequence
	}, time.Minute, 50*time.Millisecond, "an unrecognized entry does not stop the projector")

	corrupt := &nats.Msg{Subject: "cg.v1.demo.card.broken", Header: nats.Header{"CG-Entry-Kind": {"card"}}, Data: []byte(`{not json`)}
	ack, err = js.PublishMsg(corrupt)
	require.NoError(t, err)
	require.Eventually(t, func() bool { c, _ := readyz(); return c == http.StatusServiceUnavailable }, time.Minute, 50*time.Millisecond)
	_, body := readyz()
	require.NotContains(t, body, "step", "a stopped projector is a fault, not a step of serve's start: %v", body)
	require.NotEmpty(t, body["reason"])

	out, code := s.run(t, "projector", "skip", "--seq", fmt.Sprint(ack.Sequence+100), "--reason", "typo")
	require.Equal(t, 1, code, "a skip past the end is refused: %s", out)
	out, code = s.run(t, "projector", "skip", "--seq", fmt.Sprint(ack.Sequence), "--reason", "garbage published by hand", "--actor", "oncall", "--json")
	require.Equal(t, 0, code, out)
	require.Eventually(t, func() bool { c, _ := readyz(); return c == http.StatusOK }, time.Minute, 50*time.Millisecond, "the skip un-sticks the projector")

	out, code = s.run(t, "verify", "--json")
	require.Equal(t, 0, code, out)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.EqualValues(t, 1, v["unrecognized_count"])
	require.EqualValues(t, 1, v["skip_count"])
	require.Contains(t, out, "garbage published by hand")
}

// TestResultCardIDsCannotBeSquatted: a client that may put cards in a
// project takes, ahead of time, every id the executor would use for a call's
// result card if those ids were predictable; the call still resolves.
func TestResultCardIDsCannotBeSquatted(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	worker := s.issue(t, "--project", "demo", "--role", "worker", "--agent", "mallory")
	nc := s.connectAs(t, worker)
	for delivery := 1; delivery <= 5; delivery++ {
		sum := sha256.Sum256([]byte(fmt.Sprintf("demo\x00t-sq\x00c-sq\x00%d", delivery)))
		id := "res-" + hex.EncodeToString(sum[:16])
		r := req(t, nc, "cgledger.v1.demo.mallory.card.put", nil, map[string]any{
			"card_id": id, "project_id": "demo", "type": "tool.result", "author_id": "cgledger.executor",
			"function_name": "echo", "agent_turn_id": "t-sq", "tool_call_id": "c-sq",
			"content": map[string]any{"status": "failed", "error": map[string]string{"code": "internal_error"}},
		})
		require.True(t, r.OK, "%+v", r.Error)
	}
	out, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"mine"}`, "--turn", "t-sq", "--call-id", "c-sq")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"text":"mine"`)
}

// TestServePprofIsOptIn: profiles are served only when asked for, on their
// own address, and never on the API's.
func TestServePprofIsOptIn(t *testing.T) {
	pprofPort := servetest.FreePort(t)
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t), "--pprof", fmt.Sprintf("127.0.0.1:%d", pprofPort))
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/", pprofPort))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get(s.httpURL() + "/debug/pprof/")
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEqual(t, http.StatusOK, resp.StatusCode, "not on the API listener")
}
