package e2e

import (
	"bufio"
	"bytes"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/servetest"
)

var updateGolden = flag.Bool("update", false, "regenerate golden files under testdata/")

// TestMetricsLintAndFamilies scrapes a serve that has run calls, a refused
// request and a duplicate: /metrics passes promlint, and its cgledger_*
// families are the ones in testdata/metrics_families.golden (go test
// ./test/e2e -run TestMetricsLintAndFamilies -update rewrites it).
func TestMetricsLintAndFamilies(t *testing.T) {
	s := startServer(t, t.TempDir(), servetest.FreePort(t), servetest.FreePort(t))
	_, code := s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"m"}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 0, code)
	_, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"m"}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 0, code, "a repeated call is a duplicate")
	_, code = s.run(t, "call", "--project", "demo", "--agent", "alice", "--tool", "echo", "--args", `{"text":"other"}`, "--turn", "t1", "--call-id", "c1")
	require.Equal(t, 1, code, "the same call with other arguments is a conflict")

	resp, err := http.Get(s.httpURL() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)

	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "# TYPE "); ok {
			name, kind, _ := strings.Cut(name, " ")
			if strings.HasPrefix(name, "cgledger_") {
				seen[name+" "+kind] = true
			}
		}
	}
	families := make([]string, 0, len(seen))
	for f := range seen {
		families = append(families, f)
	}
	sort.Strings(families)
	got := strings.Join(families, "\n") + "\n"
	golden := filepath.Join("testdata", "metrics_families.golden")
	if *updateGolden {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "run with -update to create %s", golden)
	require.Equal(t, string(want), got, "the exported metric families changed: review, then run with -update")
	// No id is a label: calls, turns and agents never appear in a series.
	require.NotContains(t, string(body), `"c1"`)
	require.NotContains(t, string(body), `"t1"`)
	require.NotContains(t, string(body), `"alice"`)
}
