package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/internal/auth"
	"github.com/cgledger/cgledger/internal/dashboards"
	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
	"github.com/cgledger/cgledger/protocol"
)

// prom is a real Prometheus scraping one serve (job cgledger) and
// evaluating dashboards/rules.yml, both every second.
type prom struct {
	base string
	log  *servetest.LogBuffer
}

// startPrometheus runs /usr/bin/prometheus (skipping where it is missing)
// against target (host:port of serve's HTTP listener) until the test ends.
func startPrometheus(t *testing.T, target string) *prom {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		testenv.Skip(t, "prometheus not installed (apt-get install prometheus): %v", err)
	}
	dir := t.TempDir()
	rules, err := filepath.Abs(filepath.Join("..", "..", "dashboards", "rules.yml"))
	require.NoError(t, err)
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: cgledger
    static_configs: [{targets: [%q]}]
`, rules, target)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600))
	port := servetest.FreePort(t)
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	p := &prom{base: fmt.Sprintf("http://127.0.0.1:%d", port), log: &servetest.LogBuffer{}}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", p.log.String())
		}
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 100*time.Millisecond, "prometheus becomes ready")
	return p
}

// sample is one series of an instant query's answer.
type sample struct {
	Labels map[string]string
	Value  float64
}

func (s sample) String() string {
	keys := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("{")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%s=%q", k, s.Labels[k])
	}
	fmt.Fprintf(&b, "} %g", s.Value)
	return b.String()
}

func (p *prom) get(path string, out any) error {
	resp, err := http.Get(p.base + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("%s: decode: %w", path, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s", path, r.Error)
	}
	return json.Unmarshal(r.Data, out)
}

// query runs an instant query now.
func (p *prom) query(q string) ([]sample, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(q), &d); err != nil {
		return nil, err
	}
	value := func(v [2]any) float64 {
		s, _ := v[1].(string)
		f, _ := strconv.ParseFloat(s, 64)
		return f
	}
	switch d.ResultType {
	case "vector":
		var vs []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(d.Result, &vs); err != nil {
			return nil, err
		}
		out := make([]sample, 0, len(vs))
		for _, v := range vs {
			out = append(out, sample{Labels: v.Metric, Value: value(v.Value)})
		}
		return out, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(d.Result, &v); err != nil {
			return nil, err
		}
		return []sample{{Labels: map[string]string{}, Value: value(v)}}, nil
	}
	return nil, fmt.Errorf("query %s: result type %s", q, d.ResultType)
}

// value is the value of q's series whose labels include match; ok is
// false when there is none.
func (p *prom) value(q string, match map[string]string) (float64, bool) {
	ss, err := p.query(q)
	if err != nil {
		return 0, false
	}
	for _, s := range ss {
		if hasLabels(s.Labels, match) {
			return s.Value, true
		}
	}
	return 0, false
}

// alert is one entry of /api/v1/alerts: an alert pending or firing.
type alert struct {
	Name     string
	Labels   map[string]string
	State    string
	ActiveAt time.Time
	Value    float64
}

func (a alert) String() string {
	return fmt.Sprintf("%s%v %s since %s value %g", a.Name, a.Labels, a.State, a.ActiveAt.Format(time.RFC3339Nano), a.Value)
}

// alerts lists the alerts Prometheus holds now (pending and firing).
func (p *prom) alerts() ([]alert, error) {
	var d struct {
		Alerts []struct {
			Labels   map[string]string `json:"labels"`
			State    string            `json:"state"`
			ActiveAt time.Time         `json:"activeAt"`
			Value    string            `json:"value"`
		} `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", &d); err != nil {
		return nil, err
	}
	out := make([]alert, 0, len(d.Alerts))
	for _, a := range d.Alerts {
		v, _ := strconv.ParseFloat(a.Value, 64)
		out = append(out, alert{Name: a.Labels["alertname"], Labels: a.Labels, State: a.State, ActiveAt: a.ActiveAt, Value: v})
	}
	return out, nil
}

// find returns the alert named name whose labels include match.
func find(as []alert, name string, match map[string]string) (alert, bool) {
	for _, a := range as {
		if a.Name == name && hasLabels(a.Labels, match) {
			return a, true
		}
	}
	return alert{}, false
}

func hasLabels(ls, match map[string]string) bool {
	for k, v := range match {
		if ls[k] != v {
			return false
		}
	}
	return true
}

// condition is something to wait for; check says whether it holds now and,
// when not, what was seen instead.
type condition struct {
	what  string
	check func() (bool, string)
}

// waitAll polls every condition until all hold or timeout passes, and
// reports (t.Errorf, so that the test goes on) each one that never held,
// with what was seen last. It returns whether all held.
func waitAll(t *testing.T, timeout time.Duration, conds ...condition) bool {
	t.Helper()
	held := make([]bool, len(conds))
	seen := make([]string, len(conds))
	all := pollUntil(500*time.Millisecond, time.Now().Add(timeout), func() bool {
		all := true
		for i, c := range conds {
			if !held[i] {
				held[i], seen[i] = c.check()
				all = all && held[i]
			}
		}
		return all
	})
	for i, c := range conds {
		if !held[i] {
			t.Errorf("after %s: %s: never held; last seen: %s", timeout, c.what, seen[i])
		}
	}
	return all
}

// pollUntil calls done at once and then at every tick of interval until it
// returns true or deadline passes, and returns its last answer.
func pollUntil(interval time.Duration, deadline time.Time, done func() bool) bool {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if done() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
}

// holdsNow reports (t.Errorf) a condition that does not hold now.
func holdsNow(t *testing.T, c condition) bool {
	t.Helper()
	ok, seen := c.check()
	if !ok {
		t.Errorf("%s: does not hold; seen: %s", c.what, seen)
	}
	return ok
}

// alertPending is the condition: alert name with labels match is pending
// (its `for` is longer than the test waits), and its value passes valueOK.
func alertPending(p *prom, name string, match map[string]string, valueOK func(float64) bool, what string) condition {
	return condition{what: fmt.Sprintf("%s%v pending, %s", name, match, what), check: func() (bool, string) {
		as, err := p.alerts()
		if err != nil {
			return false, err.Error()
		}
		a, ok := find(as, name, match)
		if !ok {
			return false, "not active; active alerts: " + alertList(as)
		}
		if a.State != "pending" || !valueOK(a.Value) {
			return false, a.String()
		}
		return true, a.String()
	}}
}

func alertList(as []alert) string {
	if len(as) == 0 {
		return "none"
	}
	var b []string
	for _, a := range as {
		b = append(b, a.String())
	}
	return strings.Join(b, "; ")
}

// queryHolds is the condition: q has a series with labels match whose
// value passes ok.
func queryHolds(p *prom, q string, match map[string]string, ok func(float64) bool, what string) condition {
	return condition{what: fmt.Sprintf("%s%v: %s", q, match, what), check: func() (bool, string) {
		ss, err := p.query(q)
		if err != nil {
			return false, err.Error()
		}
		for _, s := range ss {
			if hasLabels(s.Labels, match) {
				return ok(s.Value), s.String()
			}
		}
		return false, fmt.Sprintf("no such series in %v", ss)
	}}
}

// panelQueries are every query of every dashboard, with the Grafana
// variables replaced: each dashboard variable by vars[name] (".*" when
// absent), Grafana's interval variables by fixed windows.
func panelQueries(vars map[string]string) map[string]string {
	re := regexp.MustCompile(`\$\{?(\w+)\}?`)
	out := map[string]string{}
	for name, d := range dashboards.All() {
		known := map[string]bool{}
		for _, v := range d.Templating.List {
			known[v.Name] = true
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				q := re.ReplaceAllStringFunc(tg.Expr, func(m string) string {
					v := re.FindStringSubmatch(m)[1]
					switch {
					case v == "__rate_interval" || v == "__interval":
						return "1m"
					case v == "__range":
						return "5m"
					case known[v] && vars[v] != "":
						return vars[v]
					case known[v]:
						return ".*"
					}
					return m
				})
				out[fmt.Sprintf("%s / %s / %s", name, p.Title, tg.RefID)] = q
			}
		}
	}
	return out
}

// recordingRules are the expressions of every recording rule, by name.
func recordingRules() map[string]string {
	out := map[string]string{}
	for _, g := range dashboards.Rules().Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out[r.Record] = r.Expr
			}
		}
	}
	return out
}

// emptyQueries runs every query and lists those that return no data (or
// an error), sorted.
func emptyQueries(p *prom, qs map[string]string) []string {
	var empty []string
	for name, q := range qs {
		ss, err := p.query(q)
		switch {
		case err != nil:
			empty = append(empty, fmt.Sprintf("%s: %s: error %v", name, q, err))
		case len(ss) == 0:
			empty = append(empty, fmt.Sprintf("%s: %s", name, q))
		}
	}
	sort.Strings(empty)
	return empty
}

// toolsvc is test/faults/toolsvc serving one external tool.
type toolsvc struct {
	cmd *exec.Cmd
	log *servetest.LogBuffer
}

// buildToolsvc builds test/faults/toolsvc into dir.
func buildToolsvc(dir string) (string, error) {
	bin := filepath.Join(dir, "toolsvc")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/cgledger/cgledger/test/faults/toolsvc").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build toolsvc: %v: %s", err, out)
	}
	return bin, nil
}

// startToolsvc serves tool (target tool) of project demo on s with a tool
// credential and waits until it pulls.
func startToolsvc(t *testing.T, s *server, bin, tool string) *toolsvc {
	t.Helper()
	path := filepath.Join(t.TempDir(), tool+".creds")
	out, code := s.run(t, "creds", "issue", "--json", "--ttl", "0", "--out", path, "--project", "demo", "--role", "tool", "--tool", tool)
	require.Equal(t, 0, code, out)
	var c struct {
		InboxPrefix string `json:"inbox_prefix"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &c), out)
	ts := &toolsvc{log: &servetest.LogBuffer{}}
	ts.cmd = exec.Command(bin, "-nats-url", s.natsURL(), "-creds", path, "-inbox-prefix", c.InboxPrefix,
		"-project", "demo", "-target", tool, "-source-id", "svc."+tool)
	ts.cmd.Stdout, ts.cmd.Stderr = ts.log, ts.log
	require.NoError(t, ts.cmd.Start())
	t.Cleanup(func() {
		if ts.cmd.ProcessState == nil {
			_ = ts.cmd.Process.Kill()
			_ = ts.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("toolsvc %s log:\n%s", tool, ts.log.String())
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(ts.log.String(), "ready ") },
		time.Minute, 50*time.Millisecond, "toolsvc %s pulls", tool)
	return ts
}

func (ts *toolsvc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, ts.cmd.Process.Signal(syscall.SIGKILL))
	_ = ts.cmd.Wait()
}

// caller dispatches calls to project demo as the embedded admin (agent
// alice), over a connection it makes again when serve restarts (serve
// writes a new admin credential each time it starts).
type caller struct {
	natsURL, data string

	mu sync.Mutex
	nc *nats.Conn
	cl *client.Client

	stats sync.Map // tool -> *[2]int (acknowledged, failed)
}

func newCaller(t *testing.T, s *server) *caller {
	c := &caller{natsURL: s.natsURL(), data: s.Data}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.nc != nil {
			c.nc.Close()
		}
	})
	return c
}

// conn returns the connection and client, connecting when there is none.
func (c *caller) conn() (*nats.Conn, *client.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nc != nil && !c.nc.IsClosed() {
		return c.nc, c.cl, nil
	}
	creds := filepath.Join(c.data, "auth", "admin.creds")
	_, inbox, err := auth.ReadCreds(creds)
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(c.natsURL, nats.UserCredentials(creds), nats.CustomInboxPrefix(inbox), nats.NoReconnect())
	if err != nil {
		return nil, nil, err
	}
	c.nc, c.cl = nc, client.New(nc, client.WithActor("alice"), client.WithTimeout(10*time.Second))
	return c.nc, c.cl, nil
}

// drop closes nc so that the next request connects again, unless another
// request already replaced it.
func (c *caller) drop(nc *nats.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nc == nc {
		nc.Close()
	}
}

// dispatch makes one call of tool (a target of the same name) in turn,
// with timeoutMS (0: the tool's default); nil means the ledger
// acknowledged it.
func (c *caller) dispatch(tool, args string, timeoutMS int64, turn, id string) error {
	nc, cl, err := c.conn()
	if err == nil {
		sum := sha256.Sum256([]byte("demo\x00" + turn + "\x00" + id))
		cardID := "cc-" + hex.EncodeToString(sum[16:28])
		trace := hex.EncodeToString(sum[:16])
		req := protocol.DispatchRequest{
			Subject:  protocol.ToolCommandSubject(protocol.DefaultVersion, "demo", "main", tool),
			Identity: protocol.Identity{AgentID: "alice", AgentTurnID: turn, TurnEpoch: 1, ToolCallID: id, Traceparent: "00-" + trace + "-" + trace[:16] + "-01"},
			Card: protocol.Card{CardID: cardID, ProjectID: "demo", Type: protocol.CardToolCall, AuthorID: "alice", AgentTurnID: turn, ToolCallID: id,
				Content:  json.RawMessage(`{"tool_name":"` + tool + `","arguments":` + args + `}`),
				Metadata: protocol.CardMetadata{TraceID: trace, ParentStepID: turn, StepID: "step-" + id}},
			Payload: protocol.ToolCommandPayload{ToolCallCardID: cardID, ToolName: tool, AfterExecution: protocol.AfterSuspend, TimeoutMS: timeoutMS},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		_, err = cl.Dispatch(ctx, req)
		cancel()
		if _, answered := protocol.AsError(err); err != nil && !answered {
			c.drop(nc)
		}
	}
	v, _ := c.stats.LoadOrStore(tool, &[2]int{})
	c.mu.Lock()
	if err == nil {
		v.(*[2]int)[0]++
	} else {
		v.(*[2]int)[1]++
	}
	c.mu.Unlock()
	return err
}

// acked is how many calls of tool the ledger acknowledged.
func (c *caller) acked(tool string) int {
	v, ok := c.stats.Load(tool)
	if !ok {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return v.(*[2]int)[0]
}

// malformed sends a card.put whose body is not JSON: the ledger refuses it
// (bad_request) and records the rejection. It returns whether the ledger
// answered.
func (c *caller) malformed() bool {
	nc, _, err := c.conn()
	if err != nil {
		return false
	}
	_, err = nc.Request(protocol.APISubject("demo", "alice", protocol.OpCardPut), []byte("{not json"), 10*time.Second)
	if err != nil {
		c.drop(nc)
		return false
	}
	return true
}

// stream is a load of calls to one tool at a fixed pace, until stopped.
type stream struct {
	stop chan struct{}
	done chan struct{}
}

// every dispatches a call of tool with args every period (count calls, or
// until stopped when count is 0).
func (c *caller) every(t *testing.T, period time.Duration, count int, tool, args string, timeoutMS int64) *stream {
	st := &stream{stop: make(chan struct{}), done: make(chan struct{})}
	turn := fmt.Sprintf("load-%s-%d", tool, time.Now().UnixNano())
	go func() {
		defer close(st.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for i := 0; count == 0 || i < count; i++ {
			_ = c.dispatch(tool, args, timeoutMS, turn, strconv.Itoa(i))
			select {
			case <-st.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(st.halt)
	return st
}

// halt stops the stream and waits for its last call.
func (st *stream) halt() {
	select {
	case <-st.stop:
	default:
		close(st.stop)
	}
	<-st.done
}
