// The official TypeScript SDK's client against cgledger's MCP front door
// (docs/mcp.md). Run by test/mcp/front (TestTypeScriptClient):
//   node ts-client.mjs URL        (bearer token in CGLEDGER_MCP_TOKEN, if any)
// It prints one JSON object of what it saw; the Go test asserts on it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = process.argv[2];
const token = process.env.CGLEDGER_MCP_TOKEN;
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
const client = new Client({ name: "cgledger-ts-test", version: "1.0.0" });
const out = {};
try {
  await client.connect(transport);
  out.sessionId = transport.sessionId;
  const tools = await client.listTools();
  out.tools = tools.tools.map((t) => ({ name: t.name, annotations: t.annotations, inputSchema: t.inputSchema }));
  const meta = { "cgledger/tool_call_id": "ts-1" };
  out.echo = await client.callTool({ name: "echo", arguments: { from: "typescript" }, _meta: meta });
  out.echoAgain = await client.callTool({ name: "echo", arguments: { from: "typescript" }, _meta: meta });
  out.timeout = await client.callTool({ name: "sleep", arguments: { ms: 60000 }, _meta: { "cgledger/timeout_ms": 300 } });
  let progress = 0;
  out.progressResult = await client.callTool(
    { name: "sleep", arguments: { ms: 1500 } },
    undefined,
    { onprogress: () => { progress++; }, timeout: 60000 },
  );
  out.progress = progress;
  try {
    await client.callTool({ name: "no_such_tool", arguments: {} });
    out.unknown = "answered";
  } catch (e) {
    out.unknown = { code: e.code, message: e.message, data: e.data };
  }
  await client.close();
} catch (e) {
  out.error = String(e && e.stack ? e.stack : e);
}
process.stdout.write(JSON.stringify(out) + "\n");
