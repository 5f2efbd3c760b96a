// An MCP server (stdio) with the tools the MCP conformance suite's server
// scenarios call (@modelcontextprotocol/conformance 0.1.16), written with
// the official TypeScript SDK. The cgledger tests run it behind the bridge
// (prefix "") so that the suite, talking to the ledger's /mcp front door,
// reaches it through the whole chain: suite -> /mcp -> ledger -> bridge ->
// this server. Schemas are given as raw JSON Schema (the low-level Server)
// so that they reach the ledger byte for byte.
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

// A 1x1 red PNG; a WAV header of no samples.
const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const wav = Buffer.from("RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00D\xac\x00\x00\x88X\x01\x00\x02\x00\x10\x00data\x00\x00\x00\x00", "latin1").toString("base64");
const resource = { type: "resource", resource: { uri: "test://embedded-resource", mimeType: "text/plain", text: "This is an embedded resource content." } };
const empty = { type: "object", properties: {} };
const sleep = (ms, signal) => new Promise((resolve, reject) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener("abort", () => { clearTimeout(t); reject(new Error("cancelled")); });
});

const tools = [
  { name: "test_simple_text", description: "Returns a simple text response.", inputSchema: empty, annotations: { readOnlyHint: true } },
  { name: "test_image_content", description: "Returns a 1x1 PNG image.", inputSchema: empty, annotations: { readOnlyHint: true } },
  { name: "test_audio_content", description: "Returns a short WAV audio clip.", inputSchema: empty, annotations: { readOnlyHint: true } },
  { name: "test_embedded_resource", description: "Returns an embedded text resource.", inputSchema: empty, annotations: { readOnlyHint: true } },
  { name: "test_multiple_content_types", description: "Returns text, an image and a resource.", inputSchema: empty, annotations: { readOnlyHint: true } },
  { name: "test_tool_with_logging", description: "Sends three log messages while it runs.", inputSchema: empty, annotations: { readOnlyHint: true } },
  { name: "test_error_handling", description: "Always fails, to test error reporting.", inputSchema: empty, annotations: { readOnlyHint: true } },
  { name: "test_tool_with_progress", description: "Reports progress 0, 50, 100 over two seconds.", inputSchema: empty, annotations: { readOnlyHint: true } },
  { name: "test_reconnection", description: "Runs a second and a half (the front door closes the stream mid-call).", inputSchema: empty, annotations: { readOnlyHint: true } },
  {
    name: "json_schema_2020_12_tool", description: "Tool with JSON Schema 2020-12 features", annotations: { readOnlyHint: true },
    inputSchema: {
      $schema: "https://json-schema.org/draft/2020-12/schema", type: "object",
      $defs: { address: { type: "object", properties: { street: { type: "string" }, city: { type: "string" } } } },
      properties: { name: { type: "string" }, address: { $ref: "#/$defs/address" } }, additionalProperties: false,
    },
  },
];

const server = new Server({ name: "cgledger-conformance-tools", version: "1.0.0" }, { capabilities: { tools: {}, logging: {} } });
server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
server.setRequestHandler(CallToolRequestSchema, async (req, extra) => {
  const text = (t) => ({ type: "text", text: t });
  const progress = async (p) => {
    const token = req.params._meta?.progressToken;
    if (token !== undefined) await extra.sendNotification({ method: "notifications/progress", params: { progressToken: token, progress: p, total: 100 } });
  };
  switch (req.params.name) {
    case "test_simple_text":
      return { content: [text("This is a simple text response for testing.")] };
    case "test_image_content":
      return { content: [{ type: "image", data: png, mimeType: "image/png" }] };
    case "test_audio_content":
      return { content: [{ type: "audio", data: wav, mimeType: "audio/wav" }] };
    case "test_embedded_resource":
      return { content: [resource] };
    case "test_multiple_content_types":
      return { content: [text("Multiple content types test:"), { type: "image", data: png, mimeType: "image/png" }, resource] };
    case "test_tool_with_logging":
      for (const m of ["Tool execution started", "Tool processing data", "Tool execution completed"]) {
        await server.sendLoggingMessage({ level: "info", logger: "conformance-tools", data: m });
        await sleep(50, extra.signal);
      }
      return { content: [text("Tool with logging executed successfully")] };
    case "test_error_handling":
      return { isError: true, content: [text("This tool intentionally returns an error for testing")] };
    case "test_tool_with_progress":
      for (const p of [0, 50, 100]) {
        await progress(p);
        if (p < 100) await sleep(1000, extra.signal);
      }
      return { content: [text("Progress test completed")] };
    case "test_reconnection":
      await sleep(1500, extra.signal);
      return { content: [text("Reconnection test completed")] };
    case "json_schema_2020_12_tool":
      return { content: [text("JSON Schema 2020-12 tool called")] };
  }
  return { isError: true, content: [text(`no scenario tool ${req.params.name}`)] };
});
await server.connect(new StdioServerTransport());
