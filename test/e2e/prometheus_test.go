package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/dashboards"
	"github.com/cgledger/cgledger/internal/servetest"
)

// The tools of TestPrometheusUnderLoadAndFaults, besides the built-ins:
// ext is served by a separate tool service (test/faults/toolsvc) that the
// test kills; idle, lowslo and gone are registered and served by nobody;
// lowslo has an SLO and little traffic; gone is answered S-TOOL-UNAVAILABLE
// at once (health.fail_fast_after_ms).
var promTools = map[string]string{
	"ext":    "limits: {timeout_ms_default: 2000}\nslo: {p95_latency_ms_max: 5000}\n",
	"gone":   "health: {fail_fast_after_ms: 500}\n",
	"idle":   "limits: {timeout_ms_default: 20000}\n",
	"lowslo": "limits: {timeout_ms_default: 2000}\nslo: {success_rate_min: 0.995}\n",
}

// TestPrometheusUnderLoadAndFaults runs a real Prometheus (scrape and rule
// evaluation every second, dashboards/rules.yml loaded) against a real
// serve on fixed ports, with a built-in and an external tool under load.
// Phase 1: every dashboard query and every recording rule returns data.
// Phase 2, faults: the external tool service killed, calls to a tool nobody
// serves, a burst of malformed requests, a low-traffic tool with an SLO and
// a few failures, and serve killed and restarted after 20 s; it asserts
// which alerts go pending (not the full `for`, which promtool's unit tests
// hold) and their values, and that alerts pending before the restart are
// still pending after it, with the same start.
func TestPrometheusUnderLoadAndFaults(t *testing.T) {
	start := time.Now()
	built := make(chan error, 1)
	binDir := t.TempDir()
	var svcBin string
	go func() {
		var err error
		svcBin, err = buildToolsvc(binDir)
		built <- err
	}()

	data := t.TempDir()
	np, hp := servetest.FreePort(t), servetest.FreePort(t)
	s := startServer(t, data, np, hp)
	p := startPrometheus(t, fmt.Sprintf("127.0.0.1:%d", hp))
	for name, extra := range promTools {
		def := filepath.Join(t.TempDir(), name+".yaml")
		require.NoError(t, os.WriteFile(def, []byte("tool_name: "+name+"\nparameters: {type: object}\n"+
			"target_subject: cg.v1.{project_id}.{channel_id}.cmd.tool."+name+"\nafter_execution: suspend\ndeterminism: idempotent\n"+extra), 0o600))
		out, code := s.run(t, "tools", "register", def, "--project", "demo")
		require.Equal(t, 0, code, out)
	}
	require.NoError(t, <-built)
	ext := startToolsvc(t, s, svcBin, "ext")
	c := newCaller(t, s)

	// Phase 1: load. Successes of both kinds of tool, failures of both
	// kinds below any burn threshold (a built-in's timeout, an external
	// tool's failed report), a late report (ext answers 9 s into a 1 s
	// call, after the ledger ended it), a call that reaches its deadline
	// unanswered, calls failed fast (nobody pulls gone), a duplicate and a
	// conflicting dispatch, malformed requests.
	c.every(t, 500*time.Millisecond, 0, "echo", `{"text":"p"}`, 0)
	c.every(t, time.Second, 0, "sleep", `{"ms":10}`, 0)
	c.every(t, 20*time.Second, 0, "sleep", `{"ms":5000}`, 300)
	c.every(t, 500*time.Millisecond, 0, "ext", `{}`, 0)
	c.every(t, 10*time.Second, 0, "ext", `{"fail":"upstream_unavailable"}`, 0)
	c.every(t, time.Second, 1, "ext", `{"delay_ms":9000}`, 1000)
	c.every(t, time.Second, 1, "lowslo", `{}`, 0)
	c.every(t, 2*time.Second, 2, "gone", `{}`, 0)
	require.NoError(t, c.dispatch("echo", `{"text":"d"}`, 0, "dup", "d1"))
	require.NoError(t, c.dispatch("echo", `{"text":"d"}`, 0, "dup", "d1"), "a duplicate dispatch is acknowledged")
	require.Error(t, c.dispatch("echo", `{"text":"other"}`, 0, "dup", "d1"), "a conflicting dispatch is refused")
	refusals := repeat(t, 2*time.Second, func() { c.malformed() })

	// Every query has data once each event happened and Prometheus has two
	// scrapes of it; wait for that, then name every query still empty.
	all := panelQueries(nil)
	for name, q := range recordingRules() {
		all["recording rule "+name] = q
	}
	// With $tool set to an external tool, every panel on the ledger's
	// signals shows it (some query of the panel has data; a panel's
	// other queries may be about events ext did not have); panels on the
	// executor's own metrics (attempts, retries of built-ins) cannot.
	extPanels := map[string]map[string]string{}
	for name, q := range panelQueries(map[string]string{"tool": "ext"}) {
		if strings.Contains(q, `"ext"`) && !strings.Contains(q, "cgledger_executor_") {
			panel := name[:strings.LastIndex(name, " / ")]
			if extPanels[panel] == nil {
				extPanels[panel] = map[string]string{}
			}
			extPanels[panel][name] = q
		}
	}
	emptyExtPanels := func() []string {
		var out []string
		for _, qs := range extPanels {
			if empty := emptyQueries(p, qs); len(empty) == len(qs) {
				out = append(out, "$tool=ext: "+strings.Join(empty, " | "))
			}
		}
		sort.Strings(out)
		return out
	}
	var empty []string
	pollUntil(2*time.Second, time.Now().Add(90*time.Second), func() bool {
		empty = append(emptyQueries(p, all), emptyExtPanels()...)
		return len(empty) == 0
	})
	if len(empty) > 0 {
		t.Errorf("%d of %d dashboard queries and recording rules, and panels with $tool=ext, return no data:\n%s",
			len(empty), len(all)+len(extPanels), strings.Join(empty, "\n"))
	}
	// The tool dropdown lists every tool, whoever serves it.
	for _, d := range dashboards.All() {
		for _, v := range d.Templating.List {
			if v.Name != "tool" {
				continue
			}
			q, _ := v.Query.(map[string]any)["query"].(string)
			metric := strings.TrimSuffix(strings.TrimPrefix(q, "label_values("), ", tool)")
			ss, err := p.query(fmt.Sprintf("group by (tool) (%s)", metric))
			require.NoError(t, err, q)
			tools := map[string]bool{}
			for _, s := range ss {
				tools[s.Labels["tool"]] = true
			}
			for _, want := range []string{"echo", "sleep", "ext", "idle", "lowslo", "gone"} {
				if !tools[want] {
					t.Errorf("dashboard %s: the tool dropdown (%s) lacks %s: %v", d.UID, q, want, tools)
				}
			}
		}
	}
	refusals.halt()
	as, err := p.alerts()
	require.NoError(t, err)
	t.Logf("phase 1 (load) done after %s; alerts: %s", time.Since(start).Round(time.Second), alertList(as))

	// Phase 2: faults, all at once. The external tool service dies while
	// calls to it keep coming (the ledger ends each at its 2 s deadline);
	// calls go to a tool nobody serves (20 s deadline); lowslo gets a few
	// more failures, far from the 50 calls the burn alerts need; a burst
	// of malformed requests as large as the requests of the last 5 minutes.
	phase2 := time.Now()
	ext.kill(t)
	// A burst, as an agent fanning out: they reach their deadline
	// together.
	idleDispatched := time.Now()
	for i := range 6 {
		require.NoError(t, c.dispatch("idle", `{}`, 0, "idle-burst", fmt.Sprint(i)))
	}
	c.every(t, time.Second, 4, "lowslo", `{}`, 0)
	n, _ := p.value(`sum(increase(cgledger_api_requests_total[5m]))`, nil)
	burst := max(400, int(n))
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < burst; i += 8 {
				if c.malformed() {
					mu.Lock()
					answered++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("refused burst: %d of %d malformed requests answered (%.0f API requests in the 5 minutes before)", answered, burst, n)

	atLeast := func(min float64) func(float64) bool { return func(v float64) bool { return v >= min } }
	positive := func(v float64) bool { return v > 0 }
	// The unserved tool's calls wait, and the oldest one's age grows.
	var firstAge float64
	waitAll(t, time.Minute, condition{what: "idle's 6 calls wait", check: func() (bool, string) {
		w, ok := p.value(`cgledger_tool_calls_waiting{tool="idle"}`, nil)
		a, ok2 := p.value(`cgledger_tool_oldest_waiting_call_age_seconds{tool="idle"}`, nil)
		firstAge = a
		return ok && ok2 && w >= 6 && a > 0, fmt.Sprintf("waiting %g (%t), oldest age %g (%t)", w, ok, a, ok2)
	}})
	lowslo := map[string]string{"tool": "lowslo"}
	// What the burn alerts compare, for lowslo: its error ratios over
	// both windows against 14.4x its own budget (1 - 0.995).
	overBudget := func(window string) condition {
		return queryHolds(p, fmt.Sprintf("cgledger:tool_errors:ratio_rate%s > on (tool) (14.4 * cgledger:tool_error_budget:ratio)", window), lowslo,
			func(v float64) bool { return v > 14.4*0.005 }, "lowslo's "+window+" error ratio is above 14.4x its budget")
	}
	phase2OK := waitAll(t, 2*time.Minute,
		queryHolds(p, `cgledger_tool_oldest_waiting_call_age_seconds`, map[string]string{"tool": "idle"},
			func(v float64) bool { return v >= firstAge+2 }, fmt.Sprintf("the oldest waiting call's age grows from %g", firstAge)),
		alertPending(p, "CgledgerToolNotAnswering", map[string]string{"tool": "ext"}, atLeast(3), "the killed service's tool: value >= 3 calls ended by the ledger"),
		alertPending(p, "CgledgerToolNotAnswering", map[string]string{"tool": "idle"}, atLeast(3), "the unserved tool, after its deadline: value >= 3"),
		alertPending(p, "CgledgerToolErrorBudgetBurnFast", map[string]string{"tool": "ext"}, atLeast(14.4*(1-dashboards.DefaultTarget)),
			"enough failing traffic: value (the error ratio) above 14.4x its budget"),
		alertPending(p, "CgledgerRejectionSpike", nil, positive, "after the refused burst"),
		// lowslo's few failures are all in: its error ratio is far above
		// what the fast burn alert allows, so only the minimum-traffic
		// guard keeps the alert quiet.
		queryHolds(p, `cgledger:tool_calls:increase1h`, lowslo, func(v float64) bool { return v >= 4 && v < 50 },
			"lowslo's calls are counted, fewer than the guard's 50"),
		queryHolds(p, `cgledger:tool_error_budget:ratio`, lowslo, func(v float64) bool { return math.Abs(v-0.005) < 1e-9 },
			"lowslo's budget is its SLO's (1 - 0.995)"),
		overBudget("5m"), overBudget("1h"),
	)
	as, err = p.alerts()
	require.NoError(t, err)
	// The unserved tool's alert came after its calls' deadline (20 s),
	// not while they waited.
	if a, ok := find(as, "CgledgerToolNotAnswering", map[string]string{"tool": "idle"}); ok && a.ActiveAt.Before(idleDispatched.Add(20*time.Second)) {
		t.Errorf("CgledgerToolNotAnswering for idle became active %s after its calls were dispatched, before their 20 s deadline: %s",
			a.ActiveAt.Sub(idleDispatched), a)
	}
	quietLowSLO := func(when string, as []alert) {
		for _, name := range []string{"CgledgerToolErrorBudgetBurnFast", "CgledgerToolErrorBudgetBurnSlow"} {
			if a, ok := find(as, name, map[string]string{"tool": "lowslo"}); ok {
				t.Errorf("%s: %s is active for a tool with a handful of calls (the minimum-traffic guard): %s", when, name, a)
			}
		}
	}
	quietLowSLO("phase 2", as)
	t.Logf("phase 2 (faults) done after %s (phase 2 took %s, all conditions held: %t); alerts: %s",
		time.Since(start).Round(time.Second), time.Since(phase2).Round(time.Second), phase2OK, alertList(as))

	// serve killed and restarted after 20 s on the same ports: it is down
	// meanwhile, and every alert active before is still active after, with
	// the same start (it did not resolve, so it will not page again).
	// Every alert active now: those asserted above, and the others the
	// faults drove (ext's slow burn and latency SLO, lowslo's
	// NotAnswering), whose inputs last across the outage.
	var before []alert
	for _, a := range as {
		if a.Name != "CgledgerServeDown" && a.Name != "CgledgerServeAbsent" {
			before = append(before, a)
		}
	}
	require.NotEmpty(t, before, "alerts are active before serve is killed")
	sameStart := func(when string) condition {
		return condition{what: when + ": every alert active before the kill is still active with the same start", check: func() (bool, string) {
			as, err := p.alerts()
			if err != nil {
				return false, err.Error()
			}
			var lost []string
			for _, b := range before {
				switch a, ok := find(as, b.Name, b.Labels); {
				case !ok:
					lost = append(lost, fmt.Sprintf("before: %s, now: not active", b))
				case !a.ActiveAt.Equal(b.ActiveAt):
					lost = append(lost, fmt.Sprintf("before: %s, now: %s", b, a))
				}
			}
			return len(lost) == 0, strings.Join(lost, "; ")
		}}
	}
	s.kill(t)
	killed := time.Now()
	waitAll(t, time.Minute,
		alertPending(p, "CgledgerServeDown", nil, func(v float64) bool { return v == 0 }, "while serve is down: value 0 (up)"))
	waitAll(t, time.Minute, condition{what: "serve has been down 20 s", check: func() (bool, string) {
		return time.Since(killed) >= 20*time.Second, time.Since(killed).String()
	}})
	holdsNow(t, sameStart("at the end of the outage"))
	s = startServer(t, data, np, hp)
	waitAll(t, time.Minute, condition{what: "Prometheus scraped the restarted serve 5 times", check: func() (bool, string) {
		v, ok := p.value(`sum_over_time(up{job="cgledger"}[10s])`, nil)
		return ok && v >= 5, fmt.Sprintf("%g (%t)", v, ok)
	}})
	holdsNow(t, sameStart("after the restart"))
	as, err = p.alerts()
	require.NoError(t, err)
	if a, ok := find(as, "CgledgerServeDown", nil); ok {
		t.Errorf("CgledgerServeDown still active once serve is scraped again: %s", a)
	}
	quietLowSLO("after the restart", as)
	if elapsed := time.Since(start); elapsed > 3*time.Minute {
		t.Logf("the test took %s, over its 3 minute budget", elapsed.Round(time.Second))
	}
	t.Logf("done after %s; alerts: %s", time.Since(start).Round(time.Second), alertList(as))
}

// repeat runs fn every period until the test ends or the returned stream
// is halted.
func repeat(t *testing.T, period time.Duration, fn func()) *stream {
	st := &stream{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(st.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			fn()
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
