package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/dashboards"
	"github.com/cgledger/cgledger/internal/servetest"
	"github.com/cgledger/cgledger/internal/testenv"
)

// TestPrometheusScrapesEveryDashboardQuery runs a real Prometheus on
// loopback against serve under a small load, with the alert rules loaded,
// and checks that every dashboard query returns data.
func TestPrometheusScrapesEveryDashboardQuery(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		testenv.Skip(t, "prometheus not installed (apt-get install prometheus): %v", err)
	}
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	dir := t.TempDir()
	rules, err := filepath.Abs(filepath.Join("..", "..", "dashboards", "rules.yml"))
	require.NoError(t, err)
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: cgledger
    static_configs: [{targets: [%q]}]
`, rules, strings.TrimPrefix(s.httpURL(), "http://"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600))
	port := servetest.FreePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	prom := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	var plog servetest.LogBuffer
	prom.Stdout, prom.Stderr = &plog, &plog
	require.NoError(t, prom.Start())
	t.Cleanup(func() {
		_ = prom.Process.Kill()
		_ = prom.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", plog.String())
		}
	})
	api := fmt.Sprintf("http://127.0.0.1:%d/api/v1/query", port)
	query := func(q string) (int, error) {
		resp, err := http.Get(api + "?query=" + url.QueryEscape(q))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return 0, err
		}
		if r.Status != "success" {
			return 0, fmt.Errorf("%s", r.Error)
		}
		return len(r.Data.Result), nil
	}

	// Load: successes, a duplicate, a conflict, a timeout; calls keep going
	// while Prometheus scrapes, so every rate has increases in its window.
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; ; i++ {
		id := fmt.Sprintf("p%d", i)
		_, _ = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"p"}`, "--turn", "tp", "--call-id", id)
		if i == 0 {
			_, _ = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"p"}`, "--turn", "tp", "--call-id", id)
			_, _ = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"other"}`, "--turn", "tp", "--call-id", id)
			_, _ = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "sleep", "--args", `{"ms":5000}`, "--timeout", "300ms", "--turn", "tp", "--call-id", "slow")
		}
		n, err := query(`count(count_over_time(cgledger_executor_calls_total[1m]) >= 5)`)
		if err == nil && n > 0 && i >= 5 {
			break
		}
		require.True(t, time.Now().Before(deadline), "Prometheus scrapes serve: %v", err)
	}

	vars := strings.NewReplacer("$__rate_interval", "1m", "$instance", ".*", "$tool", ".*")
	for name, d := range dashboards.All() {
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				q := vars.Replace(tg.Expr)
				n, err := query(q)
				require.NoError(t, err, "%s / %s: %s", name, p.Title, q)
				require.Positive(t, n, "%s / %s returns no data: %s", name, p.Title, q)
			}
		}
	}
	// The recording rules run on the scraped series.
	n, err := query(`cgledger:tool_errors:ratio_rate5m`)
	require.NoError(t, err)
	require.Positive(t, n, "the recording rules produce series")
}
