package front

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/executor"
)

// The conformance suite's tool scenarios call tools by name; these are
// registered in the project and served by scenarioTools, a tool service
// on the executor in this process, so every scenario call goes the whole
// way: tools/call -> dispatch -> command -> tool service -> result card ->
// report -> answer.
const scenarioTarget = "cg.v1.{project_id}.{channel_id}.cmd.tool.mcpscenarios"

// pngPixel is a 1x1 red PNG; wavSilence a 44-byte WAV header of no samples.
var (
	pngPixel   = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
	wavSilence = base64.StdEncoding.EncodeToString([]byte("RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00D\xac\x00\x00\x88X\x01\x00\x02\x00\x10\x00data\x00\x00\x00\x00"))
)

var scenarioDefs = []string{
	"test_simple_text: Returns a simple text response.",
	"test_image_content: Returns a 1x1 PNG image.",
	"test_audio_content: Returns a short WAV audio clip.",
	"test_embedded_resource: Returns an embedded text resource.",
	"test_multiple_content_types: Returns text, an image and a resource.",
	"test_tool_with_logging: Runs a while; the front door logs the call's story.",
	"test_error_handling: Always fails, to test error reporting.",
	"test_tool_with_progress: Runs two seconds; the front door reports progress.",
	"test_reconnection: Runs a second and a half; the front door ends the stream mid-call (mcp_stream_poll_after).",
}

const jsonSchemaTool = `{"tool_name":"json_schema_2020_12_tool","description":"Tool with JSON Schema 2020-12 features",
"parameters":{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",
"$defs":{"address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"}}}},
"properties":{"name":{"type":"string"},"address":{"$ref":"#/$defs/address"}},"additionalProperties":false},
"target_subject":"` + scenarioTarget + `","after_execution":"suspend","determinism":"pure"}`

func text(s string) map[string]any { return map[string]any{"type": "text", "text": s} }

var resource = map[string]any{"type": "resource", "resource": map[string]any{"uri": "test://embedded-resource", "mimeType": "text/plain",
	"text": "This is an embedded resource content."}}

// scenarioTools answers the scenario tools in MCP's own terms: a result
// card whose result is {"content": [...]}, which the front door passes on
// whole.
var scenarioTools = executor.ToolFunc(func(ctx context.Context, call *executor.Call) executor.Outcome {
	content := func(items ...any) executor.Outcome { return executor.Success(map[string]any{"content": items}) }
	wait := func(d time.Duration) bool {
		select {
		case <-time.After(d):
			return true
		case <-ctx.Done():
			return false
		}
	}
	switch call.ToolName {
	case "test_simple_text":
		return content(text("This is a simple text response for testing."))
	case "test_image_content":
		return content(map[string]any{"type": "image", "data": pngPixel, "mimeType": "image/png"})
	case "test_audio_content":
		return content(map[string]any{"type": "audio", "data": wavSilence, "mimeType": "audio/wav"})
	case "test_embedded_resource":
		return content(resource)
	case "test_multiple_content_types":
		return content(text("Multiple content types test:"), map[string]any{"type": "image", "data": pngPixel, "mimeType": "image/png"}, resource)
	case "test_tool_with_logging":
		if !wait(100 * time.Millisecond) {
			return executor.Retryable(executor.CodeTimeout, "interrupted", 0)
		}
		return content(text("Tool with logging executed successfully"))
	case "test_error_handling":
		return executor.Terminal("E-TEST-INTENTIONAL", "This tool intentionally returns an error for testing", "none: the error is the test")
	case "test_tool_with_progress":
		if !wait(2 * time.Second) {
			return executor.Retryable(executor.CodeTimeout, "interrupted", 0)
		}
		return content(text("Progress test completed"))
	case "test_reconnection":
		if !wait(1500 * time.Millisecond) {
			return executor.Retryable(executor.CodeTimeout, "interrupted", 0)
		}
		return content(text("Reconnection test completed"))
	case "json_schema_2020_12_tool":
		return content(text("JSON Schema 2020-12 tool called"))
	}
	return executor.Terminal("E-TEST-UNKNOWN", "no scenario tool "+call.ToolName, "")
})

// serveScenarioTools registers the scenario tools in project and runs their
// tool service on the server at natsURL (a --no-auth serve) until the test
// ends.
func serveScenarioTools(t *testing.T, natsURL, project string) {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	cl := client.New(nc, client.WithActor("scenarios"))
	ctx := ctxT(t)
	for _, d := range scenarioDefs {
		name, desc, _ := strings.Cut(d, ": ")
		def, _ := json.Marshal(map[string]any{"tool_name": name, "description": desc, "parameters": map[string]any{"type": "object"},
			"target_subject": scenarioTarget, "after_execution": "suspend", "determinism": "pure"})
		_, err := cl.RegisterToolYAML(ctx, project, def)
		require.NoError(t, err, name)
	}
	_, err = cl.RegisterToolYAML(ctx, project, []byte(jsonSchemaTool))
	require.NoError(t, err)
	// Reports go out as the tool target the calls were dispatched to.
	ex, err := executor.New(client.New(nc, client.WithActor("mcpscenarios")), nc, executor.Config{SourceID: "mcp.scenarios", Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	require.NoError(t, ex.Register("mcpscenarios", scenarioTools, nil))
	require.NoError(t, ex.Start(ctx))
	t.Cleanup(func() { ex.Stop(context.Background()) })
}

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
// scenario is about servers without one).
func TestConformance(t *testing.T) {
	dir, node := clients(t)
	s := startServer(t, "--no-auth", "--mcp-stream-poll-after", "300ms")
	serveScenarioTools(t, s.natsURL(), "conf")
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"),
		"server", "--url", s.httpURL()+"/mcp/conf/agent-1", "--suite", "all", "-o", out)
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
			ID     string `json:"id"`
			Status string `json:"status"`
			Error  string `json:"errorMessage"`
		}
		if err := json.Unmarshal(b, &checks); err != nil {
			return err
		}
		// Each scenario's results are in server-<scenario>-<time>/.
		scenario := resultDirTime.ReplaceAllString(strings.TrimPrefix(filepath.Base(filepath.Dir(path)), "server-"), "")
		for _, c := range checks {
			results[scenario+" / "+c.ID] = c.Status + " " + c.Error
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
	require.Equal(t, conformancePassing, passing, "suite output:\n%s", log)
}
