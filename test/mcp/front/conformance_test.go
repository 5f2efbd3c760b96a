package front

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/testenv"
)

var resultDirTime = regexp.MustCompile(`-\d{4}-\d{2}-\d{2}T[\d-]+Z$`)

// conformancePassing is every check of the conformance suite (0.1.16,
// server mode, active suite) the front door passes: docs/mcp.md lists each
// scenario and why those not here do not apply. A check that regresses, or
// one that newly passes, fails the test: update docs/mcp.md with this list.
var conformancePassing = []string{
	"dns-rebinding-protection / localhost-host-rebinding-rejected",
	"dns-rebinding-protection / localhost-host-valid-accepted",
	"json-schema-2020-12 / json-schema-2020-12-$defs",
	"json-schema-2020-12 / json-schema-2020-12-$schema",
	"json-schema-2020-12 / json-schema-2020-12-additionalProperties",
	"json-schema-2020-12 / json-schema-2020-12-tool-found",
	"logging-set-level / logging-set-level",
	"ping / ping",
	"prompts-list / prompts-list",
	"resources-list / resources-list",
	"server-initialize / server-initialize",
	"server-sse-multiple-streams / server-accepts-multiple-post-streams",
	"server-sse-multiple-streams / server-sse-streams-functional",
	"tools-call-audio / tools-call-audio",
	"tools-call-embedded-resource / tools-call-embedded-resource",
	"tools-call-error / tools-call-error",
	"tools-call-image / tools-call-image",
	"tools-call-mixed-content / tools-call-mixed-content",
	"tools-call-simple-text / tools-call-simple-text",
	"tools-call-with-logging / tools-call-with-logging",
	"tools-call-with-progress / tools-call-with-progress",
	"tools-list / tools-list",
}

// TestConformance runs @modelcontextprotocol/conformance against /mcp of
// a --no-auth serve (the suite sends no credential, and its DNS rebinding
// scenario is about servers without one), through the whole chain: suite
// -> /mcp -> ledger -> the mcp role's bridge -> test/mcp/servers'
// conformance-tools.mjs, an MCP server written with the TypeScript SDK that
// has the scenario tools (prefix "", so their names are the suite's). Each
// tool scenario's call goes tools/call -> dispatch -> command -> bridge ->
// MCP tools/call -> result card -> report -> answer.
func TestConformance(t *testing.T) {
	dir, node := clients(t)
	server, err := filepath.Abs(filepath.Join("..", "servers", "conformance-tools.mjs"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join("..", "servers", "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		testenv.Skip(t, "test/mcp/servers is not installed (make tools): %v", err)
	}
	cfg := filepath.Join(t.TempDir(), "bridge.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf("project: conf\nservers:\n  - name: conformance\n    prefix: \"\"\n    command: [%q, %q]\n", node, server)), 0o600))
	s := startServer(t, "--no-auth", "--mcp-stream-poll-after", "300ms", "--roles", "api,executor,projector,mcp", "--mcp-bridge", cfg)
	url := s.httpURL() + "/mcp/conf/agent-1"
	waitTools(t, url, "test_simple_text", "json_schema_2020_12_tool")
	passing := runConformance(t, dir, node, url)
	require.Equal(t, conformancePassing, passing)
}

// waitTools waits until tools/list on url has every tool of names.
func waitTools(t *testing.T, url string, names ...string) {
	t.Helper()
	waitToolsWith(t, url, http.DefaultClient, names...)
}

// runConformance runs the suite's server scenarios against url and returns
// the checks that pass, "<scenario> / <check>", sorted.
func runConformance(t *testing.T, dir, node, url string) []string {
	t.Helper()
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"),
		"server", "--url", url, "--suite", "all", "-o", out)
	cmd.Dir = dir
	log, _ := cmd.CombinedOutput() // the suite exits non-zero when any check fails
	results := map[string]string{}
	err := filepath.Walk(out, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || info.Name() != "checks.json" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var checks []struct {
			ID      string          `json:"id"`
			Status  string          `json:"status"`
			Error   string          `json:"errorMessage"`
			Details json.RawMessage `json:"details"`
		}
		if err := json.Unmarshal(b, &checks); err != nil {
			return err
		}
		// Each scenario's results are in server-<scenario>-<time>/.
		scenario := resultDirTime.ReplaceAllString(strings.TrimPrefix(filepath.Base(filepath.Dir(path)), "server-"), "")
		for _, c := range checks {
			results[scenario+" / "+c.ID] = c.Status + " " + c.Error
			if c.ID == "tools-call-with-logging" || c.ID == "tools-call-with-progress" {
				t.Logf("%s: what arrived: %s", c.ID, strings.Join(strings.Fields(string(c.Details)), " "))
			}
		}
		return nil
	})
	require.NoError(t, err)
	var passing, other []string
	for k, v := range results {
		if strings.HasPrefix(v, "SUCCESS") {
			passing = append(passing, k)
		} else {
			other = append(other, k+": "+v)
		}
	}
	sort.Strings(passing)
	sort.Strings(other)
	t.Logf("passing:\n%s\nnot passing:\n%s", strings.Join(passing, "\n"), strings.Join(other, "\n"))
	require.NotEmpty(t, results, "the suite wrote no results:\n%s", log)
	return passing
}
